"""Embeddings: vocab-parallel (each rank looks up its rows, masked, then one all-reduce),
or embedding-dim parallel when the vocabulary does not divide. A weight tied to the LM
head keeps one sharding for both uses."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from ....errors import GraphsplitError
from ....ir.meta import info
from ....ir.optable import OpKind
from ....ir.sharding import Replicate, Shard
from ....ops import tp as tpops
from ..decision import COMM, Call, Decision, LayoutView, register
from ..layout import nearest_divisor, round_up
from .fallback import unknown


@register(OpKind.EMBEDDING)
def embedding(node: fx.Node, view: LayoutView) -> Decision:
    if node.op == "call_function" and node.target is F.embedding:
        ids, w = node.args[0], node.args[1]
    elif isinstance(node.target, torch._ops.OpOverload):
        w, ids = node.args[0], node.args[1]
    else:
        return unknown(node, view)
    if not (isinstance(w, fx.Node) and w.op == "get_attr"):
        return unknown(node, view)
    needs = () if view.layout(ids).is_replicate() else ((ids, Replicate()),)
    tp = view.tp
    vocab, width = view.shape(w)
    given = view.param_layout(w)
    padding = node.kwargs.get("padding_idx", node.args[2] if len(node.args) > 2 else None)
    padding = None if padding is not None and (not isinstance(padding, int) or padding < 0) else padding
    if (given is None and vocab % tp == 0) or given == Shard(0):
        return Decision(Replicate(), inputs=needs, params=((w, Shard(0)),),
                        swap=Call(tpops.vocab_parallel_embedding, (ids, w, padding, COMM)))
    if vocab % tp and view.param_name(w) in view.linear_weights:
        raise GraphsplitError(
            f"embedding '{info(node).module or w.target}': vocabulary {vocab} cannot be split over tp={tp} "
            f"and its weight is tied to an output layer; pad the vocabulary to {round_up(vocab, tp)} "
            f"or use tp={nearest_divisor(vocab, tp)}"
        )
    if (given is None and width % tp == 0) or given == Shard(1):
        return Decision(Shard(len(view.shape(node)) - 1), inputs=needs, params=((w, Shard(1)),))
    return Decision(Replicate(), inputs=needs,
                    reason=f"embedding left replicated: neither vocabulary {vocab} nor width {width} divisible by tp={tp}")
