"""A loss over the whole batch under data parallelism: the replicas' outputs gathered before it.

A contrastive loss (CLIP's: the batch x batch logits of image and text embeddings, labels
`arange(batch)`) couples the samples: on a replica's share it is another loss. The model itself keeps
the examples apart up to its output (analysis/batch: `BatchDims.whole_loss`), so, as open_clip's
`ClipLoss(gather_with_grad=True)` does, each replica gathers every replica's outputs (and targets)
along their batch dims, in replica order, and computes the whole batch's loss. The gather is
differentiable (`_GatherAlong`): every replica's loss is the same L, the gradient
reaching a replica's own output is the sum of dL/d(output) over the replicas, dp times the whole
batch's, and the data-parallel average (DDP, FSDP) divides it by dp again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree


class _GatherAlong(torch.autograd.Function):
    """All-gather along `dim` over `group`; backward: the gradient summed over the replicas (every one
    computed the same loss on the same gathered batch), this replica's slice of it. (torch.distributed.nn's
    all_gather scatters its backward by group rank where gloo wants global ranks: not usable on a
    sub-group.)"""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        ctx.size, ctx.index = tensor.shape[dim], dist.get_rank(group)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(ctx.dim, ctx.index * ctx.size, ctx.size), None, None


def gather_replicas(values: Any, dims: Sequence[int | None], group: Any) -> Any:
    """`values` (a tensor or a pytree of them) with each leaf that has a batch dim (`dims`, one per leaf)
    joined along it with the same leaf of every replica in `group`, in replica order."""
    leaves, spec = pytree.tree_flatten(values)
    joined = []
    for leaf, dim in zip(leaves, [*dims, *[None] * (len(leaves) - len(dims))]):
        if not isinstance(leaf, torch.Tensor) or dim is None or leaf.dim() <= dim:
            joined.append(leaf)
        else:
            joined.append(_GatherAlong.apply(leaf, dim, group))
    return pytree.tree_unflatten(joined, spec)
