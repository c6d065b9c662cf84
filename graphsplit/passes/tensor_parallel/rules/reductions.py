"""Softmax and reductions over another dim keep a shard; over the sharded dim the input is
made whole. A layer or RMS norm over the last dims keeps a shard of a dim before them
(sequence parallelism's tokens), its weights read whole by every rank and their
gradients summed over tp; any other norm gets its input whole."""

from __future__ import annotations

import torch.fx as fx

from ....ir.meta import info
from ....ir.op_kinds import OpKind
from ....ir.sharding import Shard
from ..decision import BROADCAST, Decision, LayoutView, register, replicated
from ..layout import norm_dim
from ..spellings import ROW_NORMS, arg_of, describe


@register(OpKind.SOFTMAX)
def softmax(node: fx.Node, view: LayoutView) -> Decision:
    src = node.args[0]
    have = view.layout(src)
    dim = arg_of(node, 1, "dim")
    if isinstance(have, Shard) and dim is not None and norm_dim(dim, len(view.shape(src))) != have.dim:
        return Decision(have)
    return replicated(node, view, f"{describe(node)} over the sharded dim")


@register(OpKind.REDUCTION)
def reduction(node: fx.Node, view: LayoutView) -> Decision:
    src = node.args[0]
    have = view.layout(src)
    nd = len(view.shape(src))
    dim = arg_of(node, 1, "dim")
    keepdim = bool(arg_of(node, 2, "keepdim", False))
    if dim is None or not isinstance(have, Shard) or info(node).value != "tensor":
        return replicated(node, view, f"{describe(node)} reduces over every dim")
    dims = {norm_dim(x, nd) for x in (dim if isinstance(dim, (list, tuple)) else [dim])}
    if have.dim in dims:
        return replicated(node, view, f"{describe(node)} reduces over the sharded dim")
    return Decision(have.moved(have.dim if keepdim else have.dim - sum(1 for x in dims if x < have.dim)))




@register(OpKind.NORM)
def norm(node: fx.Node, view: LayoutView) -> Decision:
    src = node.args[0] if node.args else None
    have = view.layout(src)
    affine = ROW_NORMS.get(node.target) if node.op == "call_function" else None
    if isinstance(have, Shard) and affine is not None and not have.chunks and not have.padded:
        normalized = arg_of(node, 1, "normalized_shape")
        n = len(normalized) if isinstance(normalized, (list, tuple)) else 1
        if have.dim < len(view.shape(src)) - n:
            params = [arg_of(node, i, ("weight", "bias")[k]) for k, i in enumerate(affine)]
            return Decision(have, inputs=tuple((p, BROADCAST) for p in params if isinstance(p, fx.Node)))
    return replicated(node, view, f"{describe(node)} normalizes over the sharded dim")
