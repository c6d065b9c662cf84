"""BatchNorm with statistics over all data-parallel replicas (`--sync-bn`), on any backend.

torch's `nn.SyncBatchNorm` runs on CUDA only (its statistics kernels have no CPU
version). This one is written with plain ops: each replica sums x and x^2 per
channel, one all-reduce over the dp group adds them up (the sources' "global
statistics with one all-reduce"), and every replica normalizes with the global
mean and variance. The all-reduce is an autograd function whose backward is
again an all-reduce, so the gradient flowing into each replica's input includes
what the other replicas' losses owe to the shared statistics.

Running statistics are updated like BatchNorm's (unbiased variance, momentum),
from the global statistics, so every replica keeps the same buffers. In eval
mode, or with no dp group bound, it is plain BatchNorm.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


def bind_dp_group(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Every DataParallelBatchNorm inside `module` takes its statistics over `group`."""
    for sub in module.modules():
        if isinstance(sub, DataParallelBatchNorm):
            sub.dp_group = group


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class DataParallelBatchNorm(_BatchNorm):
    """A BatchNorm1d/2d/3d whose training statistics span the dp replicas."""

    dp_group: dist.ProcessGroup | None = None  # set by the backend (bind_dp_group); None: plain BatchNorm

    @classmethod
    def replacing(cls, bn: _BatchNorm) -> DataParallelBatchNorm:
        """The same layer (same parameter and buffer objects, so the same names and values)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        for key in ("num_features", "eps", "momentum", "affine", "track_running_stats"):
            setattr(new, key, getattr(bn, key))
        new._parameters.update(bn._parameters)
        new._buffers.update(bn._buffers)
        new._non_persistent_buffers_set = set(bn._non_persistent_buffers_set)
        new.training = bn.training
        return new

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.dp_group
        if not self.training or group is None or x.device.type == "meta":
            return super().forward(x)
        dims = [d for d in range(x.dim()) if d != 1]
        local_count = x.numel() // x.shape[1]
        stats = torch.cat([x.sum(dims), (x * x).sum(dims)])
        stats = _AllReduceSum.apply(stats, group)
        count = local_count * dist.get_world_size(group)  # replicas take equal shares of the batch
        mean, sq_mean = stats.chunk(2)
        mean = mean / count
        var = sq_mean / count - mean * mean
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                if self.num_batches_tracked is not None:
                    self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(var.detach() * (count / max(count - 1, 1)), alpha=momentum)
        shape = [1, -1] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y

