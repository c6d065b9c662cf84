"""Embeddings: vocab-parallel (each rank looks up its rows, masked, then one all-reduce),
or embedding-dim parallel when the vocabulary does not divide. A weight tied to the LM
head keeps one sharding for both uses: vocab-parallel, the vocabulary padded internally
to a multiple of tp where tp does not divide it (Megatron's padding; the padding rows are
never looked up, since every id is below the real vocabulary)."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from ....ir.op_kinds import OpKind
from ....ir.sharding import Replicate, Shard
from ....ops import tp as tpops
from ..decision import COMM, Call, Decision, LayoutView, register
from ..layout import paddable
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
    rows = Shard(0) if vocab % tp == 0 else Shard(0, size=vocab)
    tied = view.param_name(w) in view.linear_weights
    splits = vocab % tp == 0 or paddable(vocab, tp)
    if given == rows or (given is None and splits and (vocab % tp == 0 or tied)):
        return _vocab_parallel(node, view, needs, rows, (ids, w, padding, COMM, vocab))
    if (given is None and width % tp == 0) or given == Shard(1):
        return Decision(Shard(len(view.shape(node)) - 1), inputs=needs, params=((w, Shard(1)),))
    if given is None and splits:  # neither divides: rows padded rather than every rank holding all of them
        return _vocab_parallel(node, view, needs, rows, (ids, w, padding, COMM, vocab))
    why = f"its weight is already sharded as {given}" if given is not None else f"{vocab} rows are too few for tp={tp}"
    return Decision(Replicate(), inputs=needs, reason=f"embedding left replicated: {why}")


def _vocab_parallel(node: fx.Node, view: LayoutView, needs: tuple, rows: Shard, args: tuple) -> Decision:
    """The lookup in this rank's rows, summed over tp; under sequence parallelism the sum is left
    split on the sequence dim (the one before the features: [b, s, h], or [s, h] for positions),
    as Megatron's embedding reduce-scatters, when tp divides it."""
    shape = view.shape(node)
    if view.sequence_parallel and shape is not None and len(shape) >= 2 and shape[-2] > 1 and shape[-2] % view.tp == 0:
        seq = len(shape) - 2
        return Decision(Shard(seq), inputs=needs, params=((args[1], rows),),
                        swap=Call(tpops.vocab_parallel_embedding, args, {"seq_dim": seq}))
    return Decision(Replicate(), inputs=needs, params=((args[1], rows),), swap=Call(tpops.vocab_parallel_embedding, args))
