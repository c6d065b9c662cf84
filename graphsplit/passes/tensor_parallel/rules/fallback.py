"""Ops no rule knows, and the graph's output: sharded inputs are made whole."""

from __future__ import annotations

import torch.fx as fx

from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate
from ..decision import Decision, LayoutView, register, replicated
from ..spellings import describe


@register(OpKind.OTHER)
def unknown(node: fx.Node, view: LayoutView) -> Decision:
    """Not known to keep a shard: gather first (correct, and reported when it gathers)."""
    if not view.sharded_inputs(node):
        return Decision(view.whole(node))
    return replicated(node, view, f"{describe(node)} is not known to keep a shard")


@register(OpKind.OUTPUT)
def output(node: fx.Node, view: LayoutView) -> Decision:
    """The model's outputs are whole (vocab_parallel_loss later keeps logits sharded into the loss)."""
    return Decision(None, inputs=tuple((a, Replicate()) for a in view.sharded_inputs(node)))
