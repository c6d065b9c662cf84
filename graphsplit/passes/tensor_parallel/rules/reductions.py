"""Softmax and reductions over another dim keep a shard; over the sharded dim, or a
norm (which normalizes over the features), the input is made whole."""

from __future__ import annotations

import torch.fx as fx

from ....ir.meta import info
from ....ir.optable import OpKind
from ....ir.sharding import Shard
from ..decision import Decision, LayoutView, register, replicated
from ..layout import norm_dim
from ..spellings import arg_of, describe


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
    return Decision(Shard(have.dim if keepdim else have.dim - sum(1 for x in dims if x < have.dim)))


@register(OpKind.NORM)
def norm(node: fx.Node, view: LayoutView) -> Decision:
    return replicated(node, view, f"{describe(node)} normalizes over the sharded dim")
