"""Tensor-parallel collectives as autograd functions, with Megatron's semantics.

Stage graphs call these by name, so the generated code shows every collective:

- `copy_to_tp(x)`      f: identity forward, all-reduce of the gradient backward
                       (before a column-parallel layer whose input is replicated)
- `reduce_from_tp(x)`  g: all-reduce forward, identity backward
                       (after a row-parallel layer: sums the partial results)
- `gather_from_tp(x, dim)`  all-gather along `dim` forward, keep this rank's slice backward
- `scatter_to_tp(x, dim)`   keep this rank's slice forward, all-gather backward
- `vocab_parallel_embedding(ids, weight, vocab_start)`: lookup in this rank's rows, zero
  elsewhere, all-reduce forward

The tensor-parallel process group is set once per process by the backend
(`set_tp_group`). Every call is counted in `COUNTS` (direction, kind), which
is how tests and `transform --json` check the Megatron count.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.fx

_GROUP: dist.ProcessGroup | None = None
_SIMULATED: int = 1  # tp size pretended on meta tensors during analysis (no process group)
COUNTS: Counter[tuple[str, str]] = Counter()


def set_tp_group(group: dist.ProcessGroup | None) -> None:
    global _GROUP
    _GROUP = group


def tp_group() -> dist.ProcessGroup | None:
    return _GROUP


@contextlib.contextmanager
def simulate(tp: int) -> Iterator[None]:
    """Run tp ops without a process group as rank 0 of `tp`, shapes exact, values not
    (for the meta analysis of one rank's graph)."""
    global _SIMULATED
    saved, _SIMULATED = _SIMULATED, tp
    try:
        yield
    finally:
        _SIMULATED = saved


def _size() -> int:
    return dist.get_world_size(_GROUP) if _GROUP is not None else _SIMULATED


def _rank() -> int:
    return dist.get_rank(_GROUP) if _GROUP is not None else 0


def _all_reduce(x: torch.Tensor, direction: str) -> torch.Tensor:
    if _GROUP is None:
        return x
    COUNTS[(direction, "all_reduce")] += 1
    if _size() == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=_GROUP)
    return x


def _all_gather(x: torch.Tensor, dim: int, direction: str) -> torch.Tensor:
    n = _size()
    if _GROUP is None:
        return torch.cat([x] * n, dim=dim)
    COUNTS[(direction, "all_gather")] += 1
    if n == 1:
        return x
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=_GROUP)
    return torch.cat(parts, dim=dim)


def _local_slice(x: torch.Tensor, dim: int) -> torch.Tensor:
    n = _size()
    if n == 1:
        return x
    return x.chunk(n, dim=dim)[_rank()].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _all_reduce(grad.clone(), "backward")


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return _all_reduce(x.clone(), "forward")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):  # type: ignore[override]
        ctx.dim = dim
        return _all_gather(x, dim, "forward")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _local_slice(grad, ctx.dim), None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):  # type: ignore[override]
        ctx.dim = dim
        return _local_slice(x, dim)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _all_gather(grad, ctx.dim, "backward"), None


@torch.fx.wrap
def copy_to_tp(x: torch.Tensor) -> torch.Tensor:
    return _CopyToTP.apply(x)


@torch.fx.wrap
def reduce_from_tp(x: torch.Tensor) -> torch.Tensor:
    return _ReduceFromTP.apply(x)


@torch.fx.wrap
def gather_from_tp(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _GatherFromTP.apply(x, dim)


@torch.fx.wrap
def scatter_to_tp(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _ScatterToTP.apply(x, dim)


@torch.fx.wrap
def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """`F.embedding` over a vocabulary split in contiguous row blocks across the tp ranks."""
    rows = weight.shape[0]
    start = _rank() * rows
    outside = (ids < start) | (ids >= start + rows)
    local = (ids - start).masked_fill(outside, 0)
    local_padding = padding_idx - start if padding_idx is not None and start <= padding_idx < start + rows else None
    out = torch.nn.functional.embedding(local, weight, padding_idx=local_padding)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tp(out)


@torch.fx.wrap
def global_shape(x: torch.Tensor, dim: int) -> torch.Size:
    """`x.shape` as the unsharded tensor has it (x is sharded on `dim`)."""
    shape = list(x.shape)
    shape[dim] *= _size()
    return torch.Size(shape)


def _all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    if _GROUP is None:
        return x
    COUNTS[("forward", "all_reduce")] += 1
    x = x.contiguous()
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=_GROUP)
    return x


@torch.fx.wrap
def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """`F.cross_entropy(logits, target)` with `logits` (N, V) split over the vocabulary.

    Three all-reduces of N numbers (max, sum of exponentials, the target's logit)
    instead of gathering N x V logits. Built from differentiable ops and
    `reduce_from_tp` (all-reduce forward, identity backward), so autograd gives
    each rank the gradient of its own columns: softmax - one_hot.
    """
    rows = logits.shape[-1]
    start = _rank() * rows
    global_max = _all_reduce_max(logits.detach().amax(dim=-1))  # any shift is exact; keep it out of autograd
    shifted = logits.float() - global_max.unsqueeze(-1)
    sum_exp = reduce_from_tp(shifted.exp().sum(dim=-1))
    outside = (target < start) | (target >= start + rows)
    local_target = (target - start).masked_fill(outside, 0)
    picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    picked = reduce_from_tp(picked)
    losses = torch.log(sum_exp) - picked
    valid = target != ignore_index
    losses = losses.masked_fill(~valid, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / valid.sum()


def gather_for_inspection(x: torch.Tensor, dim: int) -> torch.Tensor:
    """All-gather outside autograd (to show or check a sharded output), not counted."""
    n = _size()
    if _GROUP is None or n == 1:
        return x
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(n)]
    dist.all_gather(parts, x.detach().contiguous(), group=_GROUP)
    return torch.cat(parts, dim=dim)
