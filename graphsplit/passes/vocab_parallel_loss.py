"""The user's loss rewritten for vocab-sharded logits.

The loss is traced as a graph (`loss_graph.trace_loss`; the one token_mean.py rewrote, when it
normalized a mean over counted tokens in it). With tp, `vocab_parallel_loss_pass`
keeps the LM head's logits sharded over the vocabulary when the loss is a
cross-entropy it can compute in that layout (`ops/tp.vocab_parallel_cross_entropy`),
and drops the gather of the logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..analysis.loss_reduction import TokenMeans
from ..analysis.shapes import annotate
from ..ir.meta import fresh_copy, info
from ..ir.sharding import S, Shard
from ..ir.traced_model import split_leaves
from ..ops import tp as tpops
from .loss_graph import trace_loss
from .manager import PassInput, PassResults
from .tensor_parallel import parallelize_loss


@dataclass(frozen=True)
class VocabParallelLoss:
    """The loss as a graph over vocab-sharded logits, and which of the model's output tensors
    stay sharded (index among the last stage's outputs -> Shard)."""

    loss_gm: fx.GraphModule
    sharded_outputs: Mapping[int, Shard]


def vocab_parallel_loss_pass(
    gm: fx.GraphModule, inp: PassInput, done: PassResults
) -> tuple[fx.GraphModule, VocabParallelLoss | None]:
    """Keep vocab-sharded logits sharded into a cross-entropy loss (tp > 1 only)."""
    loss = inp.loss
    if inp.plan.tp == 1 or loss is None or loss.target is None or loss.out_spec is None:
        return gm, None
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    tensor_leaves, kinds = split_leaves(output.args[0])
    # the leaves tensor_parallel gathered along their last dim (an LM head's logits)
    candidates = {
        i: leaf for i, leaf in enumerate(tensor_leaves)
        if leaf.op == "call_function" and leaf.target is tpops.gather_from_tp
        and leaf.args[1] == len(info(leaf).tensor.shape) - 1
    }
    if not candidates:
        return gm, None
    normalized = done.get(TokenMeans)
    examples = [torch.empty(tuple(info(t).tensor.shape), dtype=info(t).tensor.dtype, device="meta") for t in tensor_leaves]
    target = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), loss.target)
    try:
        if normalized is not None and normalized.loss_gm is not None:  # its means already rewritten
            loss_gm = fresh_copy(normalized.loss_gm)
        else:
            loss_gm = trace_loss(loss.fn, loss.out_spec, kinds, len(tensor_leaves), (*examples, target))
    except Exception:  # an untraceable loss keeps the gathered logits: correct, just slower
        return gm, None
    annotate(loss_gm, (*examples, target))
    # the logits' layout, padding included (a vocabulary tp does not divide: S(-1, size=V))
    layouts = {i: S(len(info(leaf).tensor.shape) - 1, size=leaf.kwargs.get("size")) for i, leaf in candidates.items()}
    if not parallelize_loss(loss_gm, inp.plan.tp, layouts):
        return gm, None
    sharded: dict[int, Shard] = {}
    for i, gather in candidates.items():
        value = gather.args[0]
        output.args = (tuple(value if leaf is gather else leaf for leaf in output.args[0]),)
        gm.graph.erase_node(gather)
        sharded[i] = layouts[i]
    gm.recompile()
    return gm, VocabParallelLoss(loss_gm, MappingProxyType(sharded))
