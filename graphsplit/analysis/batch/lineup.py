"""What every rule needs: an op's arguments by name, and dims lined up by broadcasting or cut
into pieces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from .atoms import Label, Value

if TYPE_CHECKING:
    from .mode import Discovery


Rule = Callable[..., None]  # (discovery: Discovery, func, args, kwargs, out) -> None


def arg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return a.default_value if a.has_default_value() else default
    return default


def dims_of(value: Any, ndim: int) -> list[int]:
    if value is None:
        return list(range(ndim))
    if isinstance(value, int):
        value = [value]
    return sorted({d % ndim for d in value}) if ndim else []


def broadcast(d: Discovery, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> list[Label]:
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


def broadcast_same(d: Discovery, tensors: Sequence[torch.Tensor]) -> list[Label]:
    labels = list(d.value(tensors[0]).labels)
    for t in tensors[1:]:
        labels = [d.unify(a, b) for a, b in zip(labels, d.value(t).labels)]
    return labels


def cut_piece(d: Discovery, label: Label, size: int, how: str) -> Label:
    """A part of a dim (a slice, a split, a narrow): a new atom, fixed if the dim was a weight's;
    the dim itself is coupled (its pieces are not the micro-batches' pieces)."""
    fixed = any(d.atoms.fixed[d.atoms.find(a)] for a in label)
    d.couple_label(label, f"{how} at {d.where()}")
    if size <= 1:
        return ()
    piece = d.atoms.new(size, fixed=fixed)
    d.atoms.piece_of[piece] = label
    return (piece,)


def keep_others(d: Discovery, x: torch.Tensor, v: Value, mixed: list[int], out: Any) -> None:
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
