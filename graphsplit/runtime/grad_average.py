"""Plain dp under the split-backward schedules: gradients averaged over the dp replicas by hand.

    averager = DPGradAverager(modules.values(), dp_group)   # after materializing: replicas made equal
    schedule.step(...)                                      # weight gradients through autograd.grad
    averager.average()                                      # one all-reduce per bucket, then / dp

DDP averages gradients from autograd hooks on each parameter's accumulator, fired by
`loss.backward()`. torch's zero-bubble schedules (zero-bubble, zbv, dualpipev) compute weight
gradients with `torch.autograd.grad` and add them to `.grad` themselves, so those hooks never fire
and the replicas would keep different gradients (torch's stage drives FSDP's post-backward by hand
for the same reason, and nothing for DDP). Here the stage modules stay unwrapped and the averaged
gradient is made after the schedule's step: the all-reduce does not overlap the backward as DDP's
does, but it is exactly DDP's result (the mean over replicas of each replica's gradient).

As DDP does at construction, the replicas' parameters and buffers are first broadcast from dp
rank 0, so they start equal even when the model given to each rank was not.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb


class DPGradAverager:
    """Average the gradients of `modules`' parameters over `group` (the dp axis), in buckets."""

    def __init__(self, modules: Iterable[nn.Module], group: dist.ProcessGroup,
                 bucket_bytes: int = BUCKET_BYTES, skip: frozenset[int] = frozenset()) -> None:
        """`skip`: ids of parameters averaged elsewhere (expert weights, `ExpertGradAverager`)."""
        self.group = group
        self.size = dist.get_world_size(group)
        self.bucket_bytes = bucket_bytes
        seen: dict[int, nn.Parameter] = {}
        tensors: dict[int, torch.Tensor] = {}
        for module in modules:
            for p in module.parameters():
                if id(p) not in skip:
                    seen.setdefault(id(p), p)
            for t in (*module.parameters(), *module.buffers()):
                if id(t) not in skip:
                    tensors.setdefault(id(t), t)
        # every replica holds the same stages, so the same parameters in the same order
        self.params = [p for p in seen.values() if p.requires_grad]
        src = dist.get_global_rank(group, 0)
        with torch.no_grad():
            for t in tensors.values():
                dist.broadcast(t, src=src, group=group)

    def _buckets(self, grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Consecutive gradients of one dtype and device, up to `bucket_bytes` each (one at least)."""
        buckets: list[list[torch.Tensor]] = []
        size = 0
        for g in grads:
            last = buckets[-1] if buckets else None
            if last is None or size + g.nbytes > self.bucket_bytes or (g.dtype, g.device) != (last[0].dtype, last[0].device):
                buckets.append([g])
                size = g.nbytes
            else:
                last.append(g)
                size += g.nbytes
        return buckets

    def average(self) -> None:
        """Each gradient becomes the mean of the replicas' gradients. A parameter whose gradient is
        None (read only where none flows) is None on every replica alike and stays so."""
        for p in self.params:  # a sparse gradient (embedding_bag(sparse=True)): averaged whole, left dense
            if p.grad is not None and p.grad.layout != torch.strided:
                dense = p.grad.to_dense()
                dist.all_reduce(dense, group=self.group)
                p.grad = dense.div_(self.size)
        grads = [p.grad for p in self.params if p.grad is not None and p.grad.layout == torch.strided]
        for bucket in self._buckets(grads):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=self.group)
            flat.div_(self.size)
            for g, averaged in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                g.copy_(averaged)


class ExpertGradAverager:
    """Expert parallelism: each expert weight's gradient made what DDP would leave on a replicated one.

    An expert-parallel rank's expert slice already holds the sum of its ep group's contributions
    (the all-to-all's backward brings every rank's rows' gradients to the experts' rank). DDP leaves
    the mean over all dp replicas on other parameters; so the slice is summed over `replicas` (the
    ranks holding the same experts in the other ep groups; None when dp == ep) and divided by dp.
    A slice no row reached on any rank (its gradient None) stays None everywhere alike only when all
    agree, so a missing gradient is taken as zeros.
    """

    def __init__(self, params: list[nn.Parameter], replicas: dist.ProcessGroup | None, dp: int,
                 exchange: dist.ProcessGroup | None = None) -> None:
        self.params = params
        self.replicas = replicas
        self.dp = dp
        # every group expert parallelism runs on (the token exchange's too): their timeouts are set with the mesh's
        self.groups = [g for g in (exchange, replicas) if g is not None]

    def average(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if self.replicas is not None:
                dist.all_reduce(p.grad, group=self.replicas)
            p.grad.div_(self.dp)
