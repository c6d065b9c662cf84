"""A loss over the whole batch under data parallelism: the replicas' outputs gathered before it.

A contrastive loss (CLIP's: the batch x batch logits of image and text embeddings, labels
`arange(batch)`) couples the samples: on a replica's share it is another loss. The model itself keeps
the examples apart up to its output (analysis/batch: `BatchDims.whole_loss`), so, as open_clip's
`ClipLoss(gather_with_grad=True)` does, each replica gathers every replica's outputs (and targets)
along their batch dims, in replica order, and computes the whole batch's loss (ops/replica_gather.py:
the gather and its gradient). Where the model's own tail pairs the samples, the graph gathers before
the tail instead (passes/replica_gather.py), and its outputs reach here whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..ops.replica_gather import GatherAlong


def gather_replicas(values: Any, dims: Sequence[int | None], group: Any) -> Any:
    """`values` (a tensor or a pytree of them) with each leaf that has a batch dim (`dims`, one per leaf)
    joined along it with the same leaf of every replica in `group`, in replica order."""
    leaves, spec = pytree.tree_flatten(values)
    joined = []
    for leaf, dim in zip(leaves, [*dims, *[None] * (len(leaves) - len(dims))]):
        if not isinstance(leaf, torch.Tensor) or dim is None or leaf.dim() <= dim:
            joined.append(leaf)
        else:
            joined.append(GatherAlong.apply(leaf, dim, group))
    return pytree.tree_unflatten(joined, spec)
