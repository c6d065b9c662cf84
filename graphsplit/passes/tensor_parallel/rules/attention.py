"""Scaled dot-product attention keeps a shard of the heads: each rank attends with its
heads; whole operands (and a mask with a heads dim) are scattered to the same heads."""

from __future__ import annotations

import torch.fx as fx

from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate, Shard
from ..decision import BROADCAST, Decision, LayoutView, Need, register, replicated
from ..spellings import arg_of
from .fallback import unknown

R = Replicate()


@register(OpKind.ATTENTION)
def attention(node: fx.Node, view: LayoutView) -> Decision:
    if node.op == "call_module":  # nn.MultiheadAttention: its weights are not graph values
        return unknown(node, view)
    q, k, v = node.args[0], node.args[1], node.args[2]
    layouts = [view.layout(t) for t in (q, k, v)]
    mask = arg_of(node, 3, "attn_mask")
    if all(s.is_replicate() for s in layouts):
        whole_mask = isinstance(mask, fx.Node) and not view.layout(mask).is_replicate()
        return Decision(R, inputs=((mask, R),) if whole_mask else ())
    qs = view.shape(q)
    head_dim = len(qs) - 3
    if any(not s.is_replicate() and s != Shard(head_dim) for s in layouts):
        return replicated(node, view, "attention sharded on a dim other than heads")
    needs: list[tuple[fx.Node, Need]] = []
    for t, s in zip((q, k, v), layouts):
        if s.is_replicate():
            if view.shape(t)[head_dim] % view.tp:
                return replicated(node, view, f"attention: {view.shape(t)[head_dim]} heads not divisible by tp={view.tp}")
            needs.append((t, Shard(head_dim)))
    if isinstance(mask, fx.Node):
        ms = view.shape(mask)
        md = head_dim - (len(qs) - len(ms))
        have = view.layout(mask)
        if isinstance(have, Shard) and have.dim != md:
            needs.append((mask, R))  # then scattered like a whole mask
            have = R
        if have.is_replicate() and md >= 0 and ms[md] != 1:
            needs.append((mask, Shard(md)))
        elif have.is_replicate():
            needs.append((mask, BROADCAST))
    return Decision(Shard(head_dim), inputs=tuple(needs))
