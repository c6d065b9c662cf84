"""Cross-entropy over vocab-sharded logits (`F.cross_entropy`, or torch.export's `cross_entropy_loss`:
an HF model's `labels=` loss): three small all-reduces instead of a gather.
Logits whose vocabulary tp does not divide (S(1, size=V)) tell it V, so their padding
columns are masked out."""

from __future__ import annotations

import torch.fx as fx

from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate
from ....ops import tp as tpops
from ..decision import COMM, Call, Decision, LayoutView, register
from ..spellings import arg_of, cross_entropy_options, vocab_parallel_loss
from .fallback import unknown


@register(OpKind.CROSS_ENTROPY)
def cross_entropy(node: fx.Node, view: LayoutView) -> Decision:
    x, target = node.args[0], arg_of(node, 1, "target")
    have = view.layout(x)
    _, reduction, ignore_index, _ = cross_entropy_options(node)
    if not (vocab_parallel_loss(node, have, view.shape(x)) and isinstance(target, fx.Node)
            and view.layout(target).is_replicate()):
        return unknown(node, view)
    call = (x, target, ignore_index, reduction, COMM)
    return Decision(Replicate(), swap=Call(tpops.vocab_parallel_cross_entropy, call,
                                           {"vocab": have.size} if have.padded else {}))
