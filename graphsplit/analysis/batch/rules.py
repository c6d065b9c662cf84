"""One rule per op family: how an ATen op relates its inputs' dim labels to its outputs'."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from .atoms import Label, Value

if TYPE_CHECKING:
    from .mode import Discovery


Rule = Callable[..., None]  # (discovery: Discovery, func, args, kwargs, out) -> None


def _arg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return a.default_value if a.has_default_value() else default
    return default


def _dims(value: Any, ndim: int) -> list[int]:
    if value is None:
        return list(range(ndim))
    if isinstance(value, int):
        value = [value]
    return sorted({d % ndim for d in value}) if ndim else []


def _broadcast(d: Discovery, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> list[Label]:
    """Right-aligned broadcasting: dims of the output's size line up; size-1 dims do not."""
    labels: list[Label] = []
    for pos in range(out.dim()):
        shared: Label = ()
        for t in tensors:
            k = pos - (out.dim() - t.dim())
            if k < 0 or t.shape[k] == 1 or t.shape[k] != out.shape[pos]:
                continue
            shared = d.unify(shared, d.value(t).labels[k]) if shared else d.whole(d.value(t).labels[k])
        labels.append(shared if out.shape[pos] > 1 else ())
    return labels


def pointwise(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = d.tensors_in(args, kwargs)
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            labels = _broadcast(d, [x for x in tensors if x.dim() <= t.dim()], t)
            d.set(t, [lab if lab or s == 1 else (d.atoms.new(s),) for lab, s in zip(labels, t.shape)])


def _like(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """zeros_like, rand_like, clone, a dropout: the first input's labels."""
    v = d.value(args[0])
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.set(t, v.labels if t.shape == args[0].shape else [(d.atoms.new(s),) if s > 1 else () for s in t.shape],
                  v.reduced)


def _factory(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """A tensor made in forward from sizes (zeros(B, T), arange(T)): its dims may line up with anything."""
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.fresh(t)


def _arange(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """arange(n), from 0 by 1: indexing a dim of size n with it keeps every row in place."""
    d.fresh(out)
    numbers = [a for a in args if isinstance(a, int | float)]
    if out.dim() == 1 and out.shape[0] > 1 and (len(numbers) == 1 or numbers[:1] == [0] and numbers[2:] in ([], [1])):
        d.atoms.iota.add(d.value(out).labels[0][0])


def _constant(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """torch.tensor([...]) and its kin: fixed values, fixed dims."""
    if isinstance(out, torch.Tensor):
        d.set(out, [(d.atoms.new(s, fixed=True),) if s > 1 else () for s in out.shape])


def _reshape(d: Discovery, src: Sequence[Label], src_shape: Sequence[int], shape: Sequence[int]) -> list[Label]:
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


def _view(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    if not isinstance(out, torch.Tensor):
        return _unknown_rule(d, func, args, kwargs, out)
    v = d.value(x)
    d.set(out, _reshape(d, v.labels, x.shape, out.shape), v.reduced)


def _view_as_complex(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    v = d.value(args[0])
    d.set(out, v.labels[:-1], v.reduced)


def _view_as_real(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    v = d.value(args[0])
    d.set(out, [*v.labels, (d.atoms.new(2),)], v.reduced)


def _permute(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
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


def _expand(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    lead = out.dim() - x.dim()
    labels = [(d.atoms.new(s),) if s > 1 else () for s in out.shape[:lead]]
    for k in range(x.dim()):
        labels.append(v.labels[k] if x.shape[k] == out.shape[lead + k] else (d.atoms.new(out.shape[lead + k]),))
    d.set(out, labels, v.reduced)


def _slice(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = _arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    labels = list(v.labels)
    if out.shape[dim] != x.shape[dim]:
        labels[dim] = _cut_piece(d, v.labels[dim], out.shape[dim], "sliced")
    d.set(out, labels, v.reduced)


def _cut_piece(d: Discovery, label: Label, size: int, how: str) -> Label:
    """A part of a dim (a slice, a split, a narrow): a new atom, fixed if the dim was a weight's;
    the dim itself is coupled (its pieces are not the micro-batches' pieces)."""
    fixed = any(d.atoms.fixed[d.atoms.find(a)] for a in label)
    d.couple_label(label, f"{how} at {d.where()}")
    return (d.atoms.new(size, fixed=fixed),) if size > 1 else ()


def _select(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = _arg(func, args, kwargs, "dim", 0) % x.dim()
    d.couple_label(v.labels[dim], f"one index of it taken at {d.where()}")
    d.set(out, [lab for k, lab in enumerate(v.labels) if k != dim], v.reduced)


def _split(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = _arg(func, args, kwargs, "dim", 0) % x.dim()
    name = func.overloadpacket.__name__
    for t in out:
        labels = list(v.labels)
        if name == "unbind":
            labels.pop(dim)
            d.couple_label(v.labels[dim], f"unbound at {d.where()}")
        elif t.shape[dim] != x.shape[dim]:
            labels[dim] = _cut_piece(d, v.labels[dim], t.shape[dim], "split")
        d.set(t, labels, v.reduced)


def _cat(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = [t for t in args[0] if t.dim() == out.dim()]
    dim = _arg(func, args, kwargs, "dim", 0) % out.dim()
    labels: list[Label] = []
    for k in range(out.dim()):
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


def _stack(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = list(args[0])
    dim = _arg(func, args, kwargs, "dim", 0) % out.dim()
    rest = [lab for k, lab in enumerate(_broadcast_same(d, tensors))]
    rest.insert(dim, (d.atoms.new(out.shape[dim]),) if out.shape[dim] > 1 else ())
    d.set(out, rest, d.reduced_in(args, kwargs))


def _broadcast_same(d: Discovery, tensors: Sequence[torch.Tensor]) -> list[Label]:
    labels = list(d.value(tensors[0]).labels)
    for t in tensors[1:]:
        labels = [d.unify(a, b) for a, b in zip(labels, d.value(t).labels)]
    return labels


def _couple_dims(dims_arg: str, default: Any = -1) -> Rule:
    """softmax, cumsum, sort, flip...: the output is shaped as the input; `dims_arg` dims are mixed."""

    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        mixed = _dims(_arg(func, args, kwargs, dims_arg, default), x.dim())
        for k in mixed:  # sorting rows (by expert) permutes them for indexing back: routing
            routed = name in ("sort", "argsort")
            d.couple_label(v.labels[k], f"{'sorted' if routed else name} along it at {d.where()}", routed=routed)
        _keep_others(d, x, v, mixed, out)

    return rule


def _last(n: int) -> Rule:
    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        mixed = list(range(max(x.dim() - n, 0), x.dim()))
        for k in mixed:
            d.couple_label(v.labels[k], f"{name} along it at {d.where()}")
        _keep_others(d, x, v, mixed, out)

    return rule


def _keep_others(d: Discovery, x: torch.Tensor, v: Value, mixed: list[int], out: Any) -> None:
    """Outputs of an op that mixes `mixed` dims (topk's values, a diagonal): the other dims keep
    their labels where the output lines up with the input, the mixed ones are new."""
    for t in pytree.tree_leaves(out):
        if not isinstance(t, torch.Tensor):
            continue
        if t.dim() == x.dim():
            d.set(t, [v.labels[k] if k not in mixed and s == x.shape[k] else (d.atoms.new(s),) if s > 1 else ()
                      for k, s in enumerate(t.shape)], v.reduced)
        elif t.dim() < x.dim():  # trailing mixed dims dropped (a diagonal, trace)
            d.set(t, [v.labels[k] if s == x.shape[k] and k not in mixed else (d.atoms.new(s),) if s > 1 else ()
                      for k, s in enumerate(t.shape)], v.reduced)
        else:
            d.fresh(t, v.reduced)


def _reduce(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return _unknown_rule(d, func, args, kwargs, out)
    v = d.value(x)
    dims = _dims(_arg(func, args, kwargs, "dim", None) or None, x.dim())
    keep = _arg(func, args, kwargs, "keepdim", False)
    removed = [a for k in dims for a in v.labels[k]]
    kept = [lab for k, lab in enumerate(v.labels) if k not in dims]
    full = not any(kept)
    name = func.overloadpacket.__name__
    if not full:
        for a in removed:
            d.atoms.couple(a, f"{name} over it at {d.where()}")
    labels = [() if k in dims else lab for k, lab in enumerate(v.labels)] if keep else kept
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.set(t, labels if t.dim() == len(labels) else [(d.atoms.new(s),) if s > 1 else () for s in t.shape],
                  v.reduced | (frozenset(removed) if full else frozenset()))


def _loss(target_index: int) -> Rule:
    """mse_loss, l1_loss, binary_cross_entropy...(self, target, ..., reduction): pointwise, then reduced."""

    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x, target = args[0], args[target_index]
        labels = _broadcast(d, [x, target], torch.empty(torch.broadcast_shapes(x.shape, target.shape), device="meta"))
        _reduced_loss(d, func, args, kwargs, out, labels)

    return rule


def _reduced_loss(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any, labels: list[Label]) -> None:
    reduction = _arg(func, args, kwargs, "reduction", 1)
    first = out[0] if isinstance(out, tuple | list) else out
    if reduction == 0:
        d.set(first, labels, d.reduced_in(args, kwargs))
    else:
        d.set(first, [], d.reduced_in(args, kwargs) | frozenset(a for lab in labels for a in lab))
    if isinstance(out, tuple | list):
        for t in out[1:]:
            d.fresh(t)


def _nll(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """nll_loss(self [N, C, d...] or [C], target [N, d...]): classes coupled, the rest lined up."""
    x, target = args[0], args[1]
    xv, tv = d.value(x), d.value(target)
    class_dim = 1 if x.dim() > 1 else 0
    d.couple_label(xv.labels[class_dim], f"{func.overloadpacket.__name__} over its classes at {d.where()}")
    rest = [lab for k, lab in enumerate(xv.labels) if k != class_dim]
    labels = [d.unify(a, b) for a, b in zip(rest, tv.labels)]
    _reduced_loss(d, func, args, kwargs, out, labels)


def _matmul_like(d: Discovery, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> list[Label]:
    """a [..., n, k] @ b [..., k, m]: batch dims broadcast, k contracted (coupled)."""
    av, bv = d.value(a), d.value(b)
    a_labels = list(av.labels) if a.dim() > 1 else [(), *av.labels]
    b_labels = list(bv.labels) if b.dim() > 1 else [*bv.labels, ()]
    k = d.unify(a_labels[-1], b_labels[-2])
    d.couple_label(k, f"a matmul contracts it at {d.where()}")
    batch_out = out.dim() - (a.dim() > 1) - (b.dim() > 1)
    labels: list[Label] = []
    for pos in range(batch_out):
        shared: Label = ()
        for lab, shape in ((a_labels[:-2], a.shape[:-2]), (b_labels[:-2], b.shape[:-2])):
            j = pos - (batch_out - len(shape))
            if 0 <= j < len(shape) and shape[j] > 1:
                shared = d.unify(shared, lab[j]) if shared else lab[j]
        labels.append(shared)
    if a.dim() > 1:
        labels.append(a_labels[-2])
    if b.dim() > 1:
        labels.append(b_labels[-1])
    return labels


def _mm(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    name = func.overloadpacket.__name__
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm", "addmv") else (args[0], args[1])
    labels = _matmul_like(d, a, b, out)
    if name in ("addmm", "baddbmm", "addmv"):
        bias = args[0]
        for k in range(bias.dim()):
            pos = out.dim() - bias.dim() + k
            if bias.shape[k] == out.shape[pos] and bias.shape[k] > 1:
                labels[pos] = d.unify(labels[pos], d.value(bias).labels[k])
    d.set(out, labels, d.reduced_in(args, kwargs))


def _attention(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """sdpa(q [..., L, E], k [..., S, E], v [..., S, Ev], mask [..., L, S]): S and E coupled."""
    q, k, v = args[0], args[1], args[2]
    qv, kv, vv = d.value(q), d.value(k), d.value(v)
    e = d.unify(qv.labels[-1], kv.labels[-1])
    d.couple_label(e, f"attention contracts it at {d.where()}")
    s = d.unify(kv.labels[-2], vv.labels[-2])
    d.couple_label(s, f"attention mixes it at {d.where()}")
    lead: list[Label] = []
    n = max(q.dim(), k.dim(), v.dim()) - 2
    for pos in range(n):
        shared: Label = ()
        for t in (q, k, v):
            j = pos - (n - (t.dim() - 2))
            if 0 <= j < t.dim() - 2 and t.shape[j] > 1:
                shared = d.unify(shared, d.value(t).labels[j]) if shared else d.value(t).labels[j]
        lead.append(shared)
    mask = _arg(func, args, kwargs, "attn_mask", None)
    if isinstance(mask, torch.Tensor):
        full = [*lead, qv.labels[-2], s]
        mv = d.value(mask)
        for j in range(mask.dim()):
            pos = len(full) - mask.dim() + j
            if mask.shape[j] > 1:
                full[pos] = d.unify(full[pos], mv.labels[j])
    first = out[0] if isinstance(out, tuple | list) else out
    d.set(first, [*lead, qv.labels[-2], vv.labels[-1]], d.reduced_in(args, kwargs))
    if isinstance(out, tuple | list):
        for t in out[1:]:
            if isinstance(t, torch.Tensor):
                d.fresh(t)


def _embedding(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    weight, indices = args[0], args[1]
    d.set(out, [*d.value(indices).labels, d.value(weight).labels[-1]], d.reduced_in(args, kwargs))


def _gather(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """gather / index_select / take_along_dim (x, dim, index): the index's rows, x's dim mixed."""
    x = args[0]
    dim = _arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    index = _arg(func, args, kwargs, "index", None)
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


def _index(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
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
    idx_labels = _broadcast(d, idx, torch.empty(shape, device="meta"))
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest_before = [xv.labels[k] for k in range(used[0])] if adjacent else []
    rest_after = [xv.labels[k] for k in range(x.dim()) if k not in used and (not adjacent or k > used[-1])]
    labels = [*rest_before, *idx_labels, *rest_after]
    if len(labels) != out.dim():
        return d.unknown(func, args, out, "")
    d.set(out, labels, d.reduced_in(args, kwargs))


def _norm_last(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """layer_norm / rms_norm (x, normalized_shape, weight, ...): the normalized dims mixed."""
    x = args[0]
    n = len(args[1])
    v = d.value(x)
    for k in range(x.dim() - n, x.dim()):
        d.couple_label(v.labels[k], f"normalized at {d.where()}")
    weight = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    if weight is not None:
        for j in range(weight.dim()):
            d.unify(v.labels[x.dim() - weight.dim() + j], d.value(weight).labels[j])
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.set(t, [*v.labels[: x.dim() - n], *([()] * (t.dim() - (x.dim() - n)))], v.reduced)


def _batch_norm(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """Training BatchNorm: statistics over the batch and spatial dims (the batch: named, not refused)."""
    x = args[0]
    v = d.value(x)
    name = func.overloadpacket.__name__
    training = name != "_native_batch_norm_legit_no_training" and bool(
        _arg(func, args, kwargs, "training", True))
    for k in range(2, x.dim()):
        d.couple_label(v.labels[k], f"BatchNorm statistics at {d.where()}")
    weight = args[1] if isinstance(args[1], torch.Tensor) else None
    if weight is not None and x.dim() > 1:
        d.unify(v.labels[1], d.value(weight).labels[0])
    if training:
        d.batch_norms.append(d.where())
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.fresh(t)


def _group_norm(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    for k in range(1, x.dim()):
        d.couple_label(v.labels[k], f"GroupNorm at {d.where()}")
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.set(t, [v.labels[0], *([()] * (t.dim() - 1))], v.reduced)


def _channels_first(what: str) -> Rule:
    """conv, pooling, interpolation, padding: [N, C, *spatial]: N kept; C kept by pooling, mixed by conv."""

    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        conv = what == "conv"
        for k in range(1 if conv else 2, x.dim()):
            if conv or x.shape[k] > 1:
                d.couple_label(v.labels[k], f"{name} over it at {d.where()}")
        for t in (out if isinstance(out, tuple | list) else (out,)):
            if not isinstance(t, torch.Tensor):
                continue
            labels: list[Label] = []
            for k, s in enumerate(t.shape):
                if k == 0 and x.dim() == t.dim():
                    labels.append(v.labels[0])
                elif k == 1 and conv and isinstance(args[1], torch.Tensor):
                    labels.append(d.value(args[1]).labels[0] if s > 1 else ())
                elif k < x.dim() and x.shape[k] == s and (k == 1 or not conv):
                    labels.append(v.labels[k])
                else:
                    labels.append((d.atoms.new(s),) if s > 1 else ())
            d.set(t, labels, v.reduced)

    return rule


def _unknown_rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    d.unknown(func, args, out, "")


def _no_tensor(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """Ops that only read metadata or return nothing new."""


def _copy(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """copy_(dst, src): dst keeps its dims, lined up with src's by broadcasting."""
    dst, src = args[0], args[1]
    labels = _broadcast(d, [dst, src], dst)
    d.set(dst, labels, d.value(dst).reduced | d.value(src).reduced)
    if isinstance(out, torch.Tensor):
        d.set(out, labels)


RULES: dict[str, Rule] = {}
for _rule, _names in (
    (_like, ("clone", "_to_copy", "detach", "alias", "lift_fresh_copy", "contiguous", "native_dropout", "dropout",
             "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
             "bernoulli", "_conj", "conj", "resolve_conj", "resolve_neg", "fill", "zero", "uniform", "normal",
             "exponential", "_conj_physical", "conj_physical", "real", "imag", "angle", "abs")),
    (_arange, ("arange",)),
    (_factory, ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "linspace",
                "empty_strided", "new_zeros", "new_ones", "new_empty", "new_full", "scalar_tensor", "eye", "tril_indices",
                "triu_indices", "new_empty_strided")),
    (_constant, ("lift_fresh", "_tensor_constant")),
    (_view, ("view", "_unsafe_view", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "flatten", "unflatten",
             "view_as", "reshape_as", "_reshape_copy", "view_copy")),
    (_view_as_complex, ("view_as_complex",)),
    (_view_as_real, ("view_as_real",)),
    (_permute, ("permute", "transpose", "t", "swapaxes", "swapdims", "numpy_T", "mT")),
    (_expand, ("expand", "expand_copy")),
    (_slice, ("slice", "narrow", "slice_copy")),
    (_select, ("select",)),
    (_split, ("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split",
              "unsafe_split_with_sizes")),
    (_cat, ("cat", "concat", "concatenate")),
    (_stack, ("stack",)),
    (_couple_dims("dim"), ("_softmax", "softmax", "_safe_softmax", "_log_softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp",
                           "cummax", "cummin", "sort", "argsort", "topk", "_softmax_backward_data", "kthvalue",
                           "median", "mode", "glu")),
    (_couple_dims("dims"), ("flip", "roll", "_fft_r2c", "_fft_c2r", "_fft_c2c")),
    (_couple_dims("repeats", None), ("repeat",)),
    (_last(2), ("tril", "triu", "diagonal", "diag_embed", "trace")),
    (_reduce, ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "std_mean",
               "logsumexp", "norm", "linalg_vector_norm", "prod", "all", "any", "count_nonzero", "nansum", "nanmean")),
    (_loss(1), ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div")),
    (_nll, ("nll_loss_forward", "nll_loss2d_forward", "nll_loss", "nll_loss_nd", "nll_loss2d")),
    (_mm, ("mm", "addmm", "bmm", "baddbmm", "matmul", "mv", "addmv", "dot")),
    (_attention, ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_fused_attention_overrideable")),
    (_embedding, ("embedding",)),
    (_gather, ("gather", "index_select", "take_along_dim")),
    (_index, ("index", "_unsafe_index")),
    (_norm_last, ("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm")),
    (_batch_norm, ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                   "_native_batch_norm_legit_no_training", "batch_norm", "_batch_norm_impl_index",
                   "cudnn_batch_norm", "_batch_norm_with_update", "_batch_norm_no_update")),
    (_group_norm, ("native_group_norm",)),
    (_channels_first("conv"), ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                               "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution")),
    (_channels_first("pool"), ("max_pool2d_with_indices", "max_pool1d", "max_pool2d", "max_pool3d_with_indices",
                               "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                               "_adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool3d",
                               "adaptive_max_pool2d", "adaptive_max_pool1d", "upsample_nearest1d",
                               "upsample_nearest2d", "upsample_bilinear2d", "upsample_linear1d", "upsample_bicubic2d",
                               "_upsample_nearest_exact2d", "constant_pad_nd", "reflection_pad1d",
                               "reflection_pad2d", "replication_pad1d", "replication_pad2d", "pixel_shuffle",
                               "pixel_unshuffle", "im2col", "col2im")),
    (_copy, ("copy", "copy_")),
    (_no_tensor, ("_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel", "_local_scalar_dense",
                  "_assert_async", "set_", "record_stream", "_assert_scalar", "item")),
):
    for _n in _names:
        RULES[_n] = _rule
RULES["masked_fill"] = pointwise
RULES["complex"] = pointwise
RULES["polar"] = pointwise
RULES["where"] = pointwise
RULES["clamp"] = pointwise
