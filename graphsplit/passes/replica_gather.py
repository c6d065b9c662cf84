"""replica_gather: where the model's own tail pairs the samples, the replicas' values gathered before it.

Batch discovery found the tail (analysis/batch/tail.py: CLIP's image x text logits, a contrastive
loss in forward) and each per-sample value it reads (`BatchDims.gather`). Under dp each replica runs
the model on its share; this pass puts `gather_replicas(x, dim, self.dp_comm)` (ops/replica_gather.py)
between each such value and the tail's nodes that read it, so the tail computes on the whole batch, the
same on every replica, and its gradient reaches each replica's rows. Other readers of the value keep
the replica's own rows. Run before the analysis, so shapes, bytes and the pipeline's cut see the
gathered values.
"""

from __future__ import annotations

import torch.fx as fx

from ..ir.batch import BatchDims
from ..ops.replica_gather import DP_COMM_ATTR, ReplicaComm, gather_replicas


def gather_before_tail(gm: fx.GraphModule, batch: BatchDims, replicas: int) -> int:
    """Insert the gathers `batch.gather` names, over `replicas` replicas; returns how many."""
    if replicas < 2 or not batch.gather:
        return 0
    nodes = {n.name: n for n in gm.graph.nodes}
    gm.add_submodule(DP_COMM_ATTR, ReplicaComm(replicas))
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        comm = gm.graph.get_attr(DP_COMM_ATTR)
    for name, dim, readers in batch.gather:
        value = nodes[name]
        with gm.graph.inserting_after(comm if value.op == "placeholder" else value):
            joined = gm.graph.call_function(gather_replicas, (value, dim, comm))
        joined.meta.update({k: v for k, v in value.meta.items() if k in ("stack_trace", "nn_module_stack")})
        for reader in readers:
            nodes[reader].replace_input_with(value, joined)
    gm.graph.lint()
    gm.recompile()
    return len(batch.gather)
