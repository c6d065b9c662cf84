"""Size queries of a sharded value answer the global size, so every size the model
computes stays global (views then make only the sharded dim's size local). On a padded
dim (a vocabulary tp does not divide) the global size is the real one, not tp blocks."""

from __future__ import annotations

import operator

import torch.fx as fx

from ....ir.op_kinds import OpKind
from ....ir.sharding import Shard, local_shape
from ....ops import tp as tpops
from ..decision import COMM, SELF, Call, Decision, LayoutView, register
from ..layout import norm_dim
from ..spellings import arg_of, op_name_of


@register(OpKind.SHAPE)
def size(node: fx.Node, view: LayoutView) -> Decision:
    src = node.args[0] if node.args else None
    have = view.layout(src)
    if not isinstance(have, Shard):
        return Decision(None)
    name = op_name_of(node)
    shape = view.shape(src)
    # a count of local entries -> the global count
    if have.padded:
        block = local_shape(shape, have, view.tp)[have.dim]
        scale = Call(tpops.unpadded, (SELF, block, have.size))
    else:
        scale = Call(operator.mul, (SELF, view.tp))
    if name in ("size", "sym_size") and arg_of(node, 1, "dim") is not None:
        if norm_dim(arg_of(node, 1, "dim"), len(shape)) != have.dim:
            return Decision(None)
        return Decision(None, then=scale)
    if name in ("numel", "sym_numel"):
        return Decision(None, then=scale)
    if name in ("size", "getattr"):  # the whole torch.Size (`x.size()`, `x.shape`)
        return Decision(None, then=Call(tpops.global_shape, (src, have.dim, COMM), {"size": have.size} if have.padded else {}))
    return Decision(None)
