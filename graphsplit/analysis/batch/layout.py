"""Rules of ops that move, make or pick values without mixing them: views, permutes, slices,
splits, concatenations, indexing, embeddings, tensors made in forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from .atoms import Label
from .chunks import cut, rejoin
from .lineup import arg, broadcast, broadcast_same, cut_piece

if TYPE_CHECKING:
    from .mode import Discovery


def like(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """zeros_like, rand_like, clone, a dropout: the first input's labels."""
    v = d.value(args[0])
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.set(t, v.labels if t.shape == args[0].shape else [(d.atoms.new(s),) if s > 1 else () for s in t.shape],
                  v.reduced)


def factory(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """A tensor made in forward from sizes (zeros(B, T), arange(T)): its dims may line up with anything."""
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.fresh(t)


def arange(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """arange(n), from 0 by 1: indexing a dim of size n with it keeps every row in place."""
    d.fresh(out)
    numbers = [a for a in args if isinstance(a, int | float)]
    if out.dim() == 1 and out.shape[0] > 1 and (len(numbers) == 1 or numbers[:1] == [0] and numbers[2:] in ([], [1])):
        d.atoms.iota.add(d.value(out).labels[0][0])


def constant(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """torch.tensor([...]) and its kin: fixed values, fixed dims."""
    if isinstance(out, torch.Tensor):
        d.set(out, [(d.atoms.new(s, fixed=True),) if s > 1 else () for s in out.shape])


def reshape(d: Discovery, src: Sequence[Label], src_shape: Sequence[int], shape: Sequence[int]) -> list[Label]:
    """A view's output labels: the input's atoms regrouped, an atom split where a dim cuts through it."""
    queue = [a for label in src for a in d.expand(label)]
    labels: list[Label] = []
    for size in shape:
        if size == 1:
            labels.append(())
            continue
        taken: list[int] = []
        product = 1
        while product < size and queue:
            a = queue.pop(0)
            taken.append(a)
            product *= d.atoms.size[a]
        if product == size:
            labels.append(d.whole(tuple(taken)))
            continue
        if taken and product > size and (size * d.atoms.size[taken[-1]]) % product == 0:
            a = taken[-1]
            inner = size * d.atoms.size[a] // product  # how much of atom a this dim holds
            rest = d.atoms.size[a] // inner
            pieces = (d.atoms.new(inner, origin=a), d.atoms.new(rest, origin=a))
            d.atoms.children[a] = pieces
            d.atoms.couple(a, f"a reshape cuts through it at {d.where()}")
            labels.append(d.whole((*taken[:-1], pieces[0])))
            queue.insert(0, pieces[1])
            continue
        for a in [*taken, *queue]:
            d.atoms.couple(a, f"a reshape mixes it at {d.where()}")
        queue = []
        labels.append((d.atoms.new(size),))
    return [lab if len(lab) != 1 or d.atoms.size[lab[0]] > 1 else lab for lab in labels]


def view(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    if not isinstance(out, torch.Tensor):
        return unknown(d, func, args, kwargs, out)
    v = d.value(x)
    d.set(out, reshape(d, v.labels, x.shape, out.shape), v.reduced)


def view_as_complex(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    v = d.value(args[0])
    d.set(out, v.labels[:-1], v.reduced)


def view_as_real(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    v = d.value(args[0])
    d.set(out, [*v.labels, (d.atoms.new(2),)], v.reduced)


def permute(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    n = x.dim()
    name = func.overloadpacket.__name__
    if name == "permute":
        order = [p % n for p in args[1]]
    elif name in ("t", "numpy_T") or n < 2:
        order = list(reversed(range(n)))
    else:  # transpose, swapaxes
        i, j = args[1] % n, args[2] % n
        order = list(range(n))
        order[i], order[j] = order[j], order[i]
    d.set(out, [v.labels[p] for p in order], v.reduced)


def expand(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    lead = out.dim() - x.dim()
    labels = [(d.atoms.new(s),) if s > 1 else () for s in out.shape[:lead]]
    for k in range(x.dim()):
        labels.append(v.labels[k] if x.shape[k] == out.shape[lead + k] else (d.atoms.new(out.shape[lead + k]),))
    d.set(out, labels, v.reduced)


def repeat(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """x.repeat(sizes): x tiled, each dim repeated `count` times end to end. A count of 1 keeps the dim; a
    larger one makes (count, the dim) merged, the copies outer (row r * n + i is row i of copy r): a batch
    tiled so meets another layout's (batch, channels) only where the sizes line up as the rows do."""
    x, sizes = args[0], list(arg(func, args, kwargs, "repeats", ()))
    v = d.value(x)
    lead = len(sizes) - x.dim()
    labels: list[Label] = [(d.atoms.new(s),) if s > 1 else () for s in sizes[:lead]]
    for k in range(x.dim()):
        count = sizes[lead + k]
        if count == 1:
            labels.append(v.labels[k])
        else:
            labels.append(((d.atoms.new(count),) if count > 1 else ()) + tuple(v.labels[k]))
    d.set(out, labels, v.reduced)


def unfold(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """x.unfold(dim, size, step): windows of `dim` (patches of a series): that dim is mixed into windows
    and their positions, the others kept."""
    x = args[0]
    v = d.value(x)
    dim = arg(func, args, kwargs, "dimension", 0) % max(x.dim(), 1)
    d.couple_label(v.labels[dim], f"cut into windows at {d.where()}")
    labels = [lab if k != dim else ((d.atoms.new(out.shape[k]),) if out.shape[k] > 1 else ())
              for k, lab in enumerate(v.labels)]
    labels.append((d.atoms.new(out.shape[-1]),) if out.shape[-1] > 1 else ())
    d.set(out, labels, v.reduced)


def slice_rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    labels = list(v.labels)
    if out.shape[dim] != x.shape[dim]:
        labels[dim] = cut_piece(d, v.labels[dim], out.shape[dim], "sliced")
    d.set(out, labels, v.reduced)


def select(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = arg(func, args, kwargs, "dim", 0) % x.dim()
    d.couple_label(v.labels[dim], f"one index of it taken at {d.where()}")
    d.set(out, [lab for k, lab in enumerate(v.labels) if k != dim], v.reduced)


def split_rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = arg(func, args, kwargs, "dim", 0) % x.dim()
    name = func.overloadpacket.__name__
    label = v.labels[dim]
    if name != "unbind" and len(out) > 1 and label and not all(d.atoms.fixed[d.atoms.find(a)] for a in label):
        # chunks of a dim not a weight's alone (the tokens, batch x positions): coupled or not once all has run
        # (chunks.py)
        for t, piece in zip(out, cut(d, label, [t.shape[dim] for t in out], d.where())):
            d.set(t, [piece if k == dim else lab for k, lab in enumerate(v.labels)], v.reduced)
        return
    for t in out:
        labels = list(v.labels)
        if name == "unbind":
            labels.pop(dim)
            d.couple_label(v.labels[dim], f"unbound at {d.where()}")
        elif t.shape[dim] != x.shape[dim]:
            labels[dim] = cut_piece(d, v.labels[dim], t.shape[dim], "split")
        d.set(t, labels, v.reduced)


def cat(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = [t for t in args[0] if t.dim() == out.dim()]
    dim = arg(func, args, kwargs, "dim", 0) % out.dim()
    held = [t for t in tensors if t.shape[dim] > 0]
    if len(held) == 1:  # one tensor (einops' pack of one, `torch.cat([x])`): the output is it
        d.set(out, d.value(held[0]).labels, d.reduced_in(args, kwargs))
        return
    labels: list[Label] = []
    whole = rejoin(d, [d.value(t).labels[dim] for t in held])  # chunks put back in order: the dim they came from
    for k in range(out.dim()):
        if k == dim and whole is not None:
            labels.append(whole)
            continue
        if k == dim:
            for t in tensors:
                d.couple_label(d.value(t).labels[k], f"concatenated along it at {d.where()}")
            fixed = any(d.atoms.fixed[d.atoms.find(a)] for t in tensors for a in d.value(t).labels[k])
            labels.append((d.atoms.new(out.shape[k], fixed=fixed),) if out.shape[k] > 1 else ())
            continue
        shared: Label = ()
        for t in tensors:
            shared = d.unify(shared, d.value(t).labels[k]) if shared else d.value(t).labels[k]
        labels.append(shared)
    d.set(out, labels, d.reduced_in(args, kwargs))


def stack(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = list(args[0])
    dim = arg(func, args, kwargs, "dim", 0) % out.dim()
    rest = [lab for k, lab in enumerate(broadcast_same(d, tensors))]
    rest.insert(dim, (d.atoms.new(out.shape[dim]),) if out.shape[dim] > 1 else ())
    d.set(out, rest, d.reduced_in(args, kwargs))


def embedding(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    weight, indices = args[0], args[1]
    d.set(out, [*d.value(indices).labels, d.value(weight).labels[-1]], d.reduced_in(args, kwargs))


def index_put(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """x[indices] = values (index_put, `results[idx] += ...`): x keeps its dims; the dims the indices
    address are written at computed places (routed: each row brought back where it came from)."""
    x, indices = args[0], args[1]
    xv = d.value(x)
    for k, i in enumerate(indices):
        if i is None or k >= len(xv.labels):
            continue
        along = [lab for lab, s in zip(d.value(i).labels, i.shape) if s > 1]
        if len(along) == 1 and len(along[0]) == 1 and along[0][0] in d.atoms.iota and i.shape.numel() == x.shape[k]:
            d.unify(xv.labels[k], along[0])  # x[arange(B)[:, None], ...] = v: each row written to its own
        else:
            d.couple_label(xv.labels[k], f"written at computed rows at {d.where()}", routed=True)
    d.set(out, xv.labels, d.reduced_in(args, kwargs))


def positions(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """nonzero / argwhere / a boolean mask's selection: the positions (or elements) the data picks, as
    many as it picks. Each example's own rows are picked and later indexed back (a mixture of experts
    routes its tokens so): the input's dims are routed, not mixed; the output's rows are new."""
    x = args[0]
    for label in d.value(x).labels:
        d.couple_label(label, f"{func.overloadpacket.__name__} picks its rows by value at {d.where()}", routed=True)
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.fresh(t, d.reduced_in(args, kwargs))


def embedding_bag(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """embedding_bag(weight, indices, offsets): each bag sums the rows its offsets point at. The offsets
    are positions in the whole indices tensor: a piece of them points into another piece. With one index
    per bag (as many indices as offsets: DLRM's Criteo features, one category per sample and table) the
    indices, the offsets and the bags line up, and each piece's offsets, counted from its first, are its
    own (the program checks and rebases them: ops/bags.py); otherwise neither can be cut: both are
    coupled, the bags with them."""
    weight, indices, offsets = args[0], args[1], args[2]
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    one_each = (isinstance(offsets, torch.Tensor) and isinstance(indices, torch.Tensor) and offsets.dim() == 1
                and indices.dim() == 1 and indices.shape == offsets.shape and outs and outs[0].dim()
                and outs[0].shape[0] == offsets.shape[0])
    if one_each:
        bags = d.unify(d.value(indices).labels[0], d.value(offsets).labels[0])
        d.bags.append(d.atoms.at)
    else:
        where = f"embedding_bag's offsets are positions in its indices at {d.where()}"
        for t in (indices, offsets):
            if isinstance(t, torch.Tensor):
                for label in d.value(t).labels:
                    d.couple_label(label, where)
        bags = (d.atoms.new(outs[0].shape[0]),) if outs and outs[0].dim() and outs[0].shape[0] > 1 else ()
        d.couple_label(bags, where)
    if outs:
        d.set(outs[0], [bags, d.value(weight).labels[-1]][: outs[0].dim()], d.reduced_in(args, kwargs))
        for t in outs[1:]:
            d.fresh(t)


def gather(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """gather / index_select / take_along_dim (x, dim, index): the index's rows, x's dim mixed."""
    x = args[0]
    dim = arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    index = arg(func, args, kwargs, "index", None)
    xv = d.value(x)
    d.couple_label(xv.labels[dim], f"{func.overloadpacket.__name__} along it at {d.where()}", routed=True)
    iv = d.value(index)
    if func.overloadpacket.__name__ == "index_select":
        labels = list(xv.labels)
        labels[dim] = iv.labels[0] if iv.labels else ()
    else:
        labels = list(iv.labels)
        for k in range(min(x.dim(), index.dim())):
            if k != dim and x.shape[k] == index.shape[k] and x.shape[k] > 1:
                labels[k] = d.unify(labels[k], xv.labels[k])
    d.set(out, labels, d.reduced_in(args, kwargs))


def scatter(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """scatter / scatter_add / scatter_reduce / index_add (x, dim, index, src): x's dim mixed (rows written
    at computed places), the other dims of the index and the source lined up with x's (a loss that
    scatters each sample's target class into its own row keeps the batch: entmax's losses)."""
    x = args[0]
    dim = arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    xv = d.value(x)
    d.couple_label(xv.labels[dim], f"{func.overloadpacket.__name__} along it at {d.where()}", routed=True)
    labels = list(xv.labels)
    name = func.overloadpacket.__name__.rstrip("_")
    for key in ("index", "src", "source"):
        t = arg(func, args, kwargs, key, None)
        if not isinstance(t, torch.Tensor) or (key == "index" and name == "index_add"):  # index_add's is 1-D
            continue
        tv = d.value(t)
        for k in range(min(x.dim(), t.dim())):
            if k != dim and x.shape[k] == t.shape[k] and x.shape[k] > 1:
                labels[k] = d.unify(labels[k], tv.labels[k])
    d.set(out, labels, d.reduced_in(args, kwargs))


def index_rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """x[idx] with tensor indices: indexed dims mixed, the indices' dims in their place."""
    x, indices = args[0], args[1]
    xv = d.value(x)
    used = [k for k, i in enumerate(indices) if i is not None]
    for k in used:
        i = indices[k]
        along = [lab for lab, s in zip(d.value(i).labels, i.shape) if s > 1]
        if len(along) == 1 and len(along[0]) == 1 and along[0][0] in d.atoms.iota and i.shape.numel() == x.shape[k]:
            d.unify(xv.labels[k], along[0])  # x[arange(B)[:, None], ...]: each row its own
        else:
            d.couple_label(xv.labels[k], f"indexed by a tensor at {d.where()}", routed=True)
    idx = [i for i in indices if i is not None]
    shape = torch.broadcast_shapes(*(i.shape for i in idx))
    idx_labels = broadcast(d, idx, torch.empty(shape, device="meta"))
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest_before = [xv.labels[k] for k in range(used[0])] if adjacent else []
    rest_after = [xv.labels[k] for k in range(x.dim()) if k not in used and (not adjacent or k > used[-1])]
    labels = [*rest_before, *idx_labels, *rest_after]
    if len(labels) != out.dim():
        return d.unknown(func, args, out, "")
    d.set(out, labels, d.reduced_in(args, kwargs))


def copy(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """copy_(dst, src): dst keeps its dims, lined up with src's by broadcasting."""
    dst, src = args[0], args[1]
    labels = broadcast(d, [dst, src], dst)
    for lab in labels:  # src written into a slice of a bigger dim: src's dim is mixed wherever that dim is
        for a in lab:
            if a in d.atoms.piece_of:
                d.atoms.written_into.setdefault(d.atoms.find(a), d.atoms.piece_of[a])
    d.set(dst, labels, d.value(dst).reduced | d.value(src).reduced)
    if isinstance(out, torch.Tensor):
        d.set(out, labels)


def no_tensor(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """Ops that only read metadata or return nothing new."""


def unknown(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    d.unknown(func, args, out, "")
