"""The replicas' values gathered, differentiably: what a loss or a model tail over the whole batch reads.

A contrastive loss couples the samples (CLIP's batch x batch logits, labels `arange(batch)`): on a
replica's share it is another loss. As open_clip's `ClipLoss(gather_with_grad=True)` does, each replica
gathers every replica's per-sample values along their batch dim, in replica order, and computes the
whole batch's loss. Every replica's loss is then the same L; the gradient reaching a replica's own rows
is the sum of dL/d(rows) over the replicas, dp times the whole batch's, and the data-parallel average
(DDP, FSDP) divides it by dp again.

Two places gather: the loss's inputs, where the loss alone couples the samples
(runtime/whole_batch.py), and, where the model's own tail pairs them (analysis/batch/tail.py), the
values the tail reads, by a `gather_replicas(x, dim, self.dp_comm)` call in the graph. Its communicator
(`ReplicaComm`) is bound to the dp group where the stage runs; unbound (the analysis on meta) the call
is shaped as the gather (the value repeated over the replicas), not run.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .communicator import Communicator

DP_COMM_ATTR = "dp_comm"  # the attribute of a graph module that holds its replicas' communicator


class ReplicaComm(Communicator):
    """The dp replicas one graph's gathers run over (`link`: their process group)."""

    axis = "dp"


class GatherAlong(torch.autograd.Function):
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


def gather_replicas(x: torch.Tensor, dim: int, comm: ReplicaComm) -> torch.Tensor:
    """`x` joined along `dim` with the same value of every replica, in replica order (unbound: shaped so)."""
    if comm.link is None:
        return torch.cat([x] * comm.degree, dim) if comm.degree > 1 else x
    return GatherAlong.apply(x, dim, comm.link)


def bind_replicas(module: torch.nn.Module, group: Any) -> None:
    """Bind every replicas' communicator inside `module` to the dp process group `group`."""
    for sub in module.modules():
        if isinstance(sub, ReplicaComm):
            sub.bind(group)
