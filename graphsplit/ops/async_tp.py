"""Async tensor parallelism: sequence parallelism's collectives run as rings, each step's transfer in
flight while the matmul of the chunk already there runs (`--async-tp`).

Sequence parallelism all-gathers the tokens' shards before the column-parallel linears and
reduce-scatters the row-parallel linear's partial sums after it, each collective waited for before
(or after) the matmul that needs it. Cut along the sequence into the tp ranks' chunks, each is a ring
of tp - 1 steps (send to the next rank, receive from the previous one), and each step's transfer
overlaps a matmul on a chunk already held: the schedule of torchtitan's async TP (torch's
`fused_all_gather_matmul` / `fused_matmul_reduce_scatter`, which move the chunks by symmetric memory
on CUDA) and of Megatron's `--tp-comm-overlap` ring exchange, here with point-to-point sends, which
every backend has (`TPComm.shift`):

- `ring_column_linears(shard, weights, biases, dim, comm)`: `F.linear(all_gather(shard), w_i, b_i)` for
  every linear reading the gathered tokens (q, k, v; gate and up), one ring for all of them; keeps the
  shard for backward, where one ring gathers it again for the weights' gradients and another
  reduce-scatters the input's summed gradient, each step beside the chunk's matmuls.
- `ring_linear_reduce_scatter(x, weight, bias, dim, comm)`: `reduce_scatter(F.linear(x, w, b))`, each
  chunk's partial sum made while the one before it travels; backward gathers the output's gradient in
  a ring, each chunk's input and weight gradients computed as it arrives.

The results are the plain collectives' (a sum over ranks in another order: within rounding). A ring
step runs on the tp group's link as the collective did, tp - 1 steps of a shard each: the same bytes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from ..ir.op_kinds import OpKind, register_function_kind
from .eager import eager as _eager
from .tp_comm import TPComm


def _low(device: str) -> torch.dtype | None:
    """torch.autocast's dtype where it is on: the products run in it, as F.linear's would."""
    on = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
    return torch.get_autocast_dtype(device) if on else None


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return t if t is None or dtype is None else t.to(dtype)


def gather_ring(shard: torch.Tensor, comm: TPComm, direction: str, use: Any) -> None:
    """Every rank's shard, `use(rank, shard)` on each as it arrives (this rank's first), the next
    one's transfer in flight meanwhile."""
    comm.count(direction, "all_gather")
    n, here = comm.size, shard.contiguous()
    for step in range(n):
        pending = comm.shift(here) if step < n - 1 else None
        use((comm.rank - step) % n, here)
        if pending is not None:
            here = pending.wait()


def reduce_scatter_ring(comm: TPComm, direction: str, part: Any) -> torch.Tensor:
    """The sum over ranks of `part(chunk)` for this rank's chunk: each rank adds its part of a chunk
    to the partial sum it receives and sends it on; the next part is computed while it travels."""
    comm.count(direction, "reduce_scatter")
    n, rank = comm.size, comm.rank
    total = part((rank - 1) % n).contiguous() if n > 1 else part(rank)
    for step in range(1, n):
        pending = comm.shift(total)
        mine = part((rank - 1 - step) % n)
        total = (pending.wait() + mine).contiguous()
    return total


def chunk(x: torch.Tensor, dim: int, index: int, n: int) -> torch.Tensor:
    size = x.shape[dim] // n
    return x.narrow(dim, index * size, size)


class _RingColumnLinears(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, dim: int, comm: TPComm, count: int,
                *params: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        weights, biases = params[:count], params[count:]
        low = _low(shard.device.type)
        ctx.dtypes = (shard.dtype, [w.dtype for w in weights], [b.dtype if b is not None else None for b in biases])
        shard = _cast(shard, low)
        weights = tuple(_cast(w, low) for w in weights)
        biases = tuple(_cast(b, low) for b in biases)
        ctx.dim, ctx.comm, ctx.count, ctx.has_bias = dim, comm, count, [b is not None for b in biases]
        ctx.save_for_backward(shard, *weights)
        pieces: list[list[Any]] = [[None] * comm.size for _ in weights]

        def use(rank: int, x: torch.Tensor) -> None:
            for i, (w, b) in enumerate(zip(weights, biases)):
                pieces[i][rank] = F.linear(x, w, b)

        with torch.autocast(shard.device.type, enabled=False) if low is not None else contextlib.nullcontext():
            gather_ring(shard, comm, "forward", use)
        return tuple(torch.cat(p, dim) for p in pieces)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        shard, *weights = ctx.saved_tensors
        comm, dim, n = ctx.comm, ctx.dim, ctx.comm.size
        grads = tuple(g.to(w.dtype) if g is not None else None for g, w in zip(grads, weights))
        grad_w: list[torch.Tensor | None] = [None] * ctx.count
        grad_b: list[torch.Tensor | None] = [None] * ctx.count
        live = [i for i, g in enumerate(grads) if g is not None]
        if any(ctx.needs_input_grad[4 + i] for i in live):
            sums = {i: torch.zeros_like(weights[i]) for i in live if ctx.needs_input_grad[4 + i]}

            def use(rank: int, x: torch.Tensor) -> None:  # each chunk's share of the weights' gradients
                rows = x.flatten(0, -2)
                for i, total in sums.items():
                    total.addmm_(chunk(grads[i], dim, rank, n).flatten(0, -2).t(), rows)

            gather_ring(shard, comm, "backward", use)
            for i, total in sums.items():
                grad_w[i] = total.to(ctx.dtypes[1][i])
        for i in live:
            if ctx.has_bias[i] and ctx.needs_input_grad[4 + ctx.count + i]:
                grad_b[i] = grads[i].flatten(0, -2).sum(0).to(ctx.dtypes[2][i])
        grad_x = None
        if ctx.needs_input_grad[0] and live:
            def part(index: int) -> torch.Tensor:  # this rank's columns' share of a chunk's input gradient
                total = None
                for i in live:
                    piece = chunk(grads[i], dim, index, n).matmul(weights[i])
                    total = piece if total is None else total + piece
                return total

            grad_x = reduce_scatter_ring(comm, "backward", part).to(ctx.dtypes[0])
        return (grad_x, None, None, None, *grad_w, *grad_b)


class _RingLinearReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int,
                comm: TPComm) -> torch.Tensor:
        low = _low(x.device.type)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        x, weight, bias = _cast(x, low), _cast(weight, low), _cast(bias, low)
        ctx.dim, ctx.comm, ctx.has_bias = dim, comm, bias is not None
        ctx.save_for_backward(x, weight)
        n = comm.size
        with torch.autocast(x.device.type, enabled=False) if low is not None else contextlib.nullcontext():
            # each rank adds its bias to its partial sums, as the linear before a reduce-scatter does
            return reduce_scatter_ring(comm, "forward", lambda index: F.linear(chunk(x, dim, index, n), weight, bias))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        comm, dim, n = ctx.comm, ctx.dim, ctx.comm.size
        grad = grad.to(weight.dtype)
        want_x, want_w, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]
        pieces: list[Any] = [None] * n
        grad_w = torch.zeros_like(weight) if want_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device) if want_b else None

        def use(rank: int, g: torch.Tensor) -> None:  # the output gradient's chunk of rank `rank`
            rows = g.flatten(0, -2)
            if want_x:
                pieces[rank] = g.matmul(weight)
            if grad_w is not None:
                grad_w.addmm_(rows.t(), chunk(x, dim, rank, n).flatten(0, -2))
            if grad_b is not None:
                grad_b.add_(rows.sum(0))

        gather_ring(grad, comm, "backward", use)
        grad_x = torch.cat(pieces, dim).to(ctx.dtypes[0]) if want_x else None
        return (grad_x, grad_w.to(ctx.dtypes[1]) if grad_w is not None else None,
                grad_b.to(ctx.dtypes[2]) if grad_b is not None else None, None, None)


@torch.fx.wrap
@_eager
def ring_column_linears(shard: torch.Tensor, weights: tuple[torch.Tensor, ...],
                        biases: tuple[torch.Tensor | None, ...], dim: int, comm: TPComm) -> tuple[torch.Tensor, ...]:
    """`tuple(F.linear(gather(shard, dim), w, b) for w, b in zip(weights, biases))`, the gather a ring
    overlapped with the linears; keeps `shard` for backward (module docstring)."""
    return _RingColumnLinears.apply(shard, dim, comm, len(weights), *weights, *biases)


@torch.fx.wrap
@_eager
def ring_linear_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int,
                               comm: TPComm) -> torch.Tensor:
    """`reduce_scatter(F.linear(x, weight, bias), dim)`, the reduce-scatter a ring overlapped with the
    linear's chunks (module docstring)."""
    return _RingLinearReduceScatter.apply(x, weight, bias, dim, comm)


register_function_kind(ring_column_linears, OpKind.LINEAR)
register_function_kind(ring_linear_reduce_scatter, OpKind.LINEAR)
