"""Elementwise ops keep a shard; so do identities (clone, detach, to, dropout) and a user's autograd
Function that computes elementwise."""

from __future__ import annotations

import torch.fx as fx

from ....ir.meta import info
from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate, Shard
from ..decision import BROADCAST, Decision, LayoutView, Need, register, replicated
from ..elementwise import elementwise_call
from ..spellings import describe

R = Replicate()


@register(OpKind.IDENTITY)
def identity(node: fx.Node, view: LayoutView) -> Decision:
    """The layout of the first input. `type_as(other)` / `to(other)` read only other's
    dtype and device: its layout does not matter."""
    src = node.args[0] if node.args else None
    have = view.layout(src)
    if have.is_partial():
        return Decision(R, inputs=((src, R),))
    return Decision(have)


@register(OpKind.POINTWISE)
def pointwise(node: fx.Node, view: LayoutView) -> Decision:
    """Sharded operands agree on one (broadcast-aligned) dim; whole operands are scattered
    to it, or read whole where they broadcast along it."""
    out_shape = view.shape(node)
    tensors = [a for a in node.all_input_nodes if info(a).value == "tensor"]
    if out_shape is None or not tensors:
        return Decision(R)
    nd = len(out_shape)
    needs: list[tuple[fx.Node, Need]] = [(a, R) for a in tensors if view.layout(a).is_partial()]
    shards = {a: s for a in tensors if isinstance(s := view.layout(a), Shard)}
    dims = {s.dim + nd - len(view.shape(a)) for a, s in shards.items()}
    chunks = {s.chunks for s in shards.values()}
    if not dims:
        return Decision(R, inputs=tuple(needs))
    if len(dims) > 1 or len(chunks) > 1:
        return _whole(node, view, needs, f"{describe(node)} mixes values sharded on different dims")
    (d,) = dims
    (c,) = chunks
    for a in tensors:
        if a in shards:
            continue
        shape = view.shape(a)
        ad = d - (nd - len(shape))
        if ad < 0 or shape[ad] == 1:
            needs.append((a, BROADCAST))  # broadcast along the sharded dim: every rank uses all of it
        else:  # each rank's block (of every chunk: a bias over a merged batch x heads dim)
            needs.append((a, Shard(ad, c)))
    return Decision(Shard(d, c), inputs=tuple(needs))


def _whole(node: fx.Node, view: LayoutView, needs: list[tuple[fx.Node, Need]], reason: str) -> Decision:
    """Whole after all: the sharded operands gathered too."""
    gathers = [(a, R) for a in view.sharded_inputs(node) if not view.layout(a).is_partial()]
    return Decision(view.whole(node), inputs=(*needs, *gathers), reason=reason)


@register(OpKind.FUNCTION)
def function_call(node: fx.Node, view: LayoutView) -> Decision:
    """A user's autograd Function kept whole (its own backward runs): a shard flows through one that runs
    elementwise ops alone, forward and backward, on tensors of one shape (`runs_elementwise`: BLOOM's
    GeLUFunction), each whole input taking the same shard; any other runs on whole values."""
    sharded = view.sharded_inputs(node)
    if not sharded:
        return Decision(view.whole(node))
    layouts = {view.layout(a) for a in sharded}
    if len(layouts) > 1 or not isinstance(have := next(iter(layouts)), Shard) or not elementwise_call(node):
        return replicated(node, view, f"{describe(node)}: a custom autograd Function not known to keep a shard "
                                      "(it runs more than elementwise ops, forward or backward)")
    needs = tuple((a, have) for a in node.all_input_nodes if info(a).value == "tensor" and a not in sharded)
    out = view.whole(node)
    return Decision(tuple(have for _ in out) if isinstance(out, tuple) else have, inputs=needs)

