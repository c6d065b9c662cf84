"""Rules of ops that compute: pointwise, matmuls and attention (what they contract), norms,
softmax, reductions and losses, convolutions and pooling (what they mix)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from .atoms import Label
from .chunks import summed
from .layout import unknown
from .lineup import Rule, arg, broadcast, dims_of, keep_others

if TYPE_CHECKING:
    from .mode import Discovery


def pointwise(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = d.tensors_in(args, kwargs)
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            labels = broadcast(d, [x for x in tensors if x.dim() <= t.dim()], t)
            d.set(t, [lab if lab or s == 1 else (d.atoms.new(s),) for lab, s in zip(labels, t.shape)])


def couple_dims(dims_arg: str, default: Any = -1) -> Rule:
    """softmax, cumsum, sort, flip...: the output is shaped as the input; `dims_arg` dims are mixed."""

    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        mixed = dims_of(arg(func, args, kwargs, dims_arg, default), x.dim())
        for k in mixed:  # sorting rows (by expert) permutes them for indexing back: routing
            routed = name in ("sort", "argsort")
            d.couple_label(v.labels[k], f"{'sorted' if routed else name} along it at {d.where()}", routed=routed)
        keep_others(d, x, v, mixed, out)

    return rule


def last(n: int) -> Rule:
    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        mixed = list(range(max(x.dim() - n, 0), x.dim()))
        for k in mixed:
            d.couple_label(v.labels[k], f"{name} along it at {d.where()}")
        keep_others(d, x, v, mixed, out)

    return rule


def reduce(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return unknown(d, func, args, kwargs, out)
    v = d.value(x)
    dims = dims_of(arg(func, args, kwargs, "dim", None) or None, x.dim())
    keep = arg(func, args, kwargs, "keepdim", False)
    removed = [a for k in dims for a in v.labels[k]]
    kept = [lab for k, lab in enumerate(v.labels) if k not in dims]
    full = not any(kept)
    name = func.overloadpacket.__name__
    if full:  # a chunk of a dim summed is a share of its sum; a mean or a max of one is not (chunks.py)
        summed(d, removed, name, adds=name in ("sum", "nansum"))
    if not full:
        for a in removed:
            d.atoms.couple(a, f"{name} over it at {d.where()}")
    labels = [() if k in dims else lab for k, lab in enumerate(v.labels)] if keep else kept
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.set(t, labels if t.dim() == len(labels) else [(d.atoms.new(s),) if s > 1 else () for s in t.shape],
                  v.reduced | (frozenset(removed) if full else frozenset()))


def loss_rule(target_index: int) -> Rule:
    """mse_loss, l1_loss, binary_cross_entropy...(self, target, ..., reduction): pointwise, then reduced."""

    def rule(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x, target = args[0], args[target_index]
        labels = broadcast(d, [x, target], torch.empty(torch.broadcast_shapes(x.shape, target.shape), device="meta"))
        reduced_loss(d, func, args, kwargs, out, labels)

    return rule


def reduced_loss(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any, labels: list[Label]) -> None:
    reduction = arg(func, args, kwargs, "reduction", 1)
    first = out[0] if isinstance(out, tuple | list) else out
    if reduction != 0:
        summed(d, [a for lab in labels for a in lab], f"{func.overloadpacket.__name__}'s mean", adds=reduction == 2)
    if reduction == 0:
        d.set(first, labels, d.reduced_in(args, kwargs))
    else:
        d.set(first, [], d.reduced_in(args, kwargs) | frozenset(a for lab in labels for a in lab))
    if isinstance(out, tuple | list):
        for t in out[1:]:
            d.fresh(t)


def nll(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """nll_loss(self [N, C, d...] or [C], target [N, d...]): classes coupled, the rest lined up."""
    x, target = args[0], args[1]
    xv, tv = d.value(x), d.value(target)
    class_dim = 1 if x.dim() > 1 else 0
    d.couple_label(xv.labels[class_dim], f"{func.overloadpacket.__name__} over its classes at {d.where()}")
    for label in tv.labels:  # labels = arange(n): sample i's class is i, its position in the whole batch
        if any(a in d.atoms.iota for a in label):
            d.couple_label(label, f"{func.overloadpacket.__name__}'s target counts the samples (arange) at {d.where()}")
    rest = [lab for k, lab in enumerate(xv.labels) if k != class_dim]
    labels = [d.unify(a, b) for a, b in zip(rest, tv.labels)]
    reduced_loss(d, func, args, kwargs, out, labels)


def ctc(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """_ctc_loss(log_probs [T, N, C], targets [N, S] or every sample's concatenated, input_lengths [N],
    target_lengths [N]) -> (loss [N], log_alpha [N, T, 2S + 1]): each sample's alignment sums over its
    time steps and classes (coupled), the samples lined up with their lengths. Concatenated targets (a
    boolean mask's selection of the padded labels) are made again from each piece of the batch."""
    log_probs, targets, lengths = args[0], args[1], args[2:4]
    where = f"{func.overloadpacket.__name__} aligns over it at {d.where()}"
    labels = d.value(log_probs).labels
    if log_probs.dim() != 3:  # one unbatched sequence
        for label in labels:
            d.couple_label(label, where)
        for t in pytree.tree_leaves(out):
            d.fresh(t, d.reduced_in(args, kwargs))
        return
    d.couple_label(labels[0], where)
    d.couple_label(labels[2], where)
    samples = labels[1]
    for t in lengths:
        if isinstance(t, torch.Tensor) and t.dim() == 1:
            samples = d.unify(samples, d.value(t).labels[0])
    if targets.dim() == 2:
        padded = d.value(targets).labels
        samples = d.unify(samples, padded[0])
        d.couple_label(padded[1], where)
    loss, alpha = out[0], out[1]
    reduced = d.reduced_in(args, kwargs)
    d.set(loss, [samples], reduced)
    d.set(alpha, [samples, *[(d.atoms.new(s),) if s > 1 else () for s in alpha.shape[1:]]], reduced)
    for label in d.value(alpha).labels[1:]:
        d.couple_label(label, where)


def matmul_like(d: Discovery, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> list[Label]:
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


def mm(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    name = func.overloadpacket.__name__
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm", "addmv") else (args[0], args[1])
    labels = matmul_like(d, a, b, out)
    if name in ("addmm", "baddbmm", "addmv"):
        bias = args[0]
        for k in range(bias.dim()):
            pos = out.dim() - bias.dim() + k
            if bias.shape[k] == out.shape[pos] and bias.shape[k] > 1:
                labels[pos] = d.unify(labels[pos], d.value(bias).labels[k])
    d.set(out, labels, d.reduced_in(args, kwargs))


def cdist(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """cdist(x1 [..., P, M], x2 [..., R, M]) -> [..., P, R]: the leading dims are batched (each pair of
    batch entries on its own, as a batched matmul's), the features contracted."""
    x1, x2 = args[0], args[1]
    v1, v2 = d.value(x1), d.value(x2)
    d.couple_label(d.unify(v1.labels[-1], v2.labels[-1]), f"cdist contracts it at {d.where()}")
    lead = out.dim() - 2
    labels: list[Label] = []
    for pos in range(lead):
        shared: Label = ()
        for t, v in ((x1, v1), (x2, v2)):
            j = pos - (lead - (t.dim() - 2))
            if 0 <= j < t.dim() - 2 and t.shape[j] > 1:
                shared = d.unify(shared, v.labels[j]) if shared else v.labels[j]
        labels.append(shared)
    d.set(out, [*labels, v1.labels[-2], v2.labels[-2]], d.reduced_in(args, kwargs))


def attention(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
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
    mask = arg(func, args, kwargs, "attn_mask", None)
    if mask is None:  # the fused kernels' name for it
        mask = arg(func, args, kwargs, "attn_bias", None)
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


def norm_last(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
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


def batch_norm(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """BatchNorm: statistics over the batch and spatial dims. The batch is not coupled: per-micro-batch
    statistics are the user's own semantics, as in any data-parallel trainer (`--check` names them,
    launch/reference_batch.py); the spatial dims are."""
    x = args[0]
    v = d.value(x)
    for k in range(2, x.dim()):
        d.couple_label(v.labels[k], f"BatchNorm statistics at {d.where()}")
    weight = args[1] if isinstance(args[1], torch.Tensor) else None
    if weight is not None and x.dim() > 1:
        d.unify(v.labels[1], d.value(weight).labels[0])
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.fresh(t)


def group_norm(d: Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    for k in range(1, x.dim()):
        d.couple_label(v.labels[k], f"GroupNorm at {d.where()}")
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.set(t, [v.labels[0], *([()] * (t.dim() - 1))], v.reduced)


def channels_first(what: str) -> Rule:
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
