"""bag_offsets: each embedding_bag call cut with the batch reads its piece's own offsets.

Batch discovery cut an embedding_bag's indices and offsets with the batch (one index per bag:
`BatchDims.bags`). Each piece of the offsets holds positions in the whole batch's indices; this pass
puts `own_offsets(indices, offsets, where)` (ops/bags.py: checked, counted from the piece's first)
between the offsets and the call. torch's spellings: `aten.embedding_bag` / `aten._embedding_bag`
(weight, indices, offsets), `F.embedding_bag` (input, weight, offsets) and an `nn.EmbeddingBag` module
(input, offsets). Run before the analysis.
"""

from __future__ import annotations

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..ir.batch import BatchDims
from ..ir.meta import info
from ..ir.op_kinds import op_name
from ..ops.bags import own_offsets


def _positions(node: fx.Node, gm: fx.GraphModule) -> tuple[int, int] | None:
    """(indices, offsets) argument positions of an embedding_bag call, None for any other node."""
    if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), nn.EmbeddingBag):
        return 0, 1
    if node.op == "call_function" and node.target is F.embedding_bag:
        return 0, 2
    if node.op == "call_function" and op_name(node) in ("embedding_bag", "_embedding_bag"):
        return 1, 2
    return None


def own_bag_offsets(gm: fx.GraphModule, batch: BatchDims) -> int:
    """Rebase the offsets of the calls `batch.bags` names; returns how many."""
    if not batch.bags:
        return 0
    wanted = set(batch.bags)
    done = 0
    for node in list(gm.graph.nodes):
        found = _positions(node, gm) if node.name in wanted else None
        if found is None:
            continue
        by_name = len(node.args) <= found[1]
        indices, offsets = node.args[found[0]], node.kwargs.get("offsets") if by_name else node.args[found[1]]
        if not isinstance(offsets, fx.Node):
            continue
        source = info(node).source
        with gm.graph.inserting_before(node):
            own = gm.graph.call_function(own_offsets, (indices, offsets, str(source) if source else node.name))
        if by_name:
            node.update_kwarg("offsets", own)
        else:
            node.update_arg(found[1], own)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
