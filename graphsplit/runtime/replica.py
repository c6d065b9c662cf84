"""Ranks that must agree, made to agree, for a training loop the user wrote for DDP.

A script written for DDP gives every process its own seed (`torch.manual_seed(1337 + rank)`):
each builds its own model and draws its own batches, and DDP makes the replicas agree by
broadcasting rank 0's weights once and averaging gradients. Under pipeline and tensor
parallelism the ranks of one replica hold *parts of one model* and must also see *one batch*:

- `agreed_weights`: the model's tensors as rank 0 holds them. A fingerprint per tensor (its
  sum and sum of squares, in float64) is compared across ranks with one all-reduce each of max
  and min; only tensors that differ are broadcast, so a model built alike everywhere (one seed,
  pretrained weights) costs two small all-reduces.
- `ReplicaBatch`: each step, the replica's first rank (pp 0, tp 0) sends its batch to the other
  ranks of its replica, as Megatron broadcasts tp rank 0's batch; every replica keeps its own
  batch, as under DDP.
- `loss_everywhere`: the loss, known on the last stage, sent to every pp rank, so rank 0 can
  log it as a DDP script does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh


def _fingerprint(t: torch.Tensor) -> torch.Tensor:
    x = t.detach().to(torch.float64)
    return torch.stack([x.sum(), x.square().sum()]).cpu()


def agreed_weights(tensors: Mapping[str, torch.Tensor], device: torch.device) -> tuple[dict[str, torch.Tensor], list[str]]:
    """`tensors` (name -> tensor, every rank alike in names and shapes) with rank 0's values where the
    ranks' differ, and the names that differed. The given tensors are never written: a differing one
    is replaced in the returned mapping by rank 0's copy."""
    names = sorted(tensors)
    if not names or dist.get_world_size() == 1:
        return dict(tensors), []
    prints = torch.stack([_fingerprint(tensors[n]) for n in names]).to(device)
    high, low = prints.clone(), prints.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    # NaN (an uninitialized buffer) never equals itself: such a tensor is sent too
    differs = (high != low).any(dim=1).tolist()
    agreed = dict(tensors)
    changed = [n for n, d in zip(names, differs) if d]
    for name in changed:
        original = tensors[name]
        copy = original.detach().to(device, copy=True)
        dist.broadcast(copy, src=0)
        agreed[name] = copy.to(original.device)
    return agreed, changed


def replica_group(mesh: DeviceMesh) -> tuple[dist.ProcessGroup | None, int]:
    """This rank's replica (its dp index's pp x tp ranks) as a process group, and the global rank of
    its first rank; None where a replica is one rank. Every rank calls `new_group` for every replica."""
    grid = mesh.mesh  # global ranks, shape (dp, pp, tp)
    if grid[0].numel() == 1:
        return None, dist.get_rank()
    me = dist.get_rank()
    mine: tuple[dist.ProcessGroup | None, int] = (None, me)
    for replica in grid:
        ranks = [int(r) for r in replica.flatten()]
        group = dist.new_group(ranks)
        if me in ranks:
            mine = (group, ranks[0])
    return mine


class ReplicaBatch:
    """Gives every rank of a replica the batch its first rank was given."""

    def __init__(self, mesh: DeviceMesh, device: torch.device) -> None:
        self.group, self.first = replica_group(mesh)
        self.device = device

    def __call__(self, batch: Any) -> Any:
        """`batch` (any nest of tensors and plain values) with each tensor replaced by the first rank's.
        Plain values (ints, None) are the script's own and taken as they are. The first rank's shapes
        are sent first, so a last batch of another size is received whole."""
        if self.group is None:
            return batch
        leaves, spec = pytree.tree_flatten(batch)
        tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        if not tensors:
            return batch
        shapes = torch.tensor([d for i in tensors for d in leaves[i].shape], dtype=torch.int64, device=self.device)
        dist.broadcast(shapes, src=self.first, group=self.group)
        at = 0
        out = list(leaves)
        for i in tensors:
            given = leaves[i]
            shape = shapes[at:at + given.dim()].tolist()
            at += given.dim()
            buffer = given.detach().to(self.device, copy=True).contiguous() if dist.get_rank() == self.first \
                else torch.empty(shape, dtype=given.dtype, device=self.device)
            dist.broadcast(buffer, src=self.first, group=self.group)
            out[i] = buffer.to(given.device).requires_grad_(given.requires_grad)
        return pytree.tree_unflatten(out, spec)


def loss_everywhere(loss: torch.Tensor | None, mesh: DeviceMesh, pp: int, device: torch.device) -> torch.Tensor:
    """The loss the last stage's ranks hold, on every pp rank (a float32 scalar)."""
    value = loss.detach().to(device, torch.float32).reshape(()) if loss is not None \
        else torch.zeros((), dtype=torch.float32, device=device)
    if pp > 1:
        dist.broadcast(value, group=mesh.get_group("pp"), group_src=pp - 1)
    return value
