"""Async tensor parallelism for float8 linears: the float8 gathers as rings beside their float8 GEMMs
(`--fp8 tensorwise --sequence-parallel --async-tp`).

`ops/float8_gather.py` casts the tokens' shard once (the tp-reduced amax: the whole tensor's scale) and
all-gathers the float8 bytes for every column linear; a row linear's output gradient likewise, cast on
its shard and gathered in float8. Here each of those gathers is a ring of tp - 1 steps (`ops/async_tp.py`'s
`gather_ring`, `reduce_scatter_ring`), each step's float8 chunk in flight while the GEMMs of the chunk
already held run: torchtitan's async TP with float8 (inductor's `fused_all_gather_scaled_matmul`, which
moves the float8 chunks and scales them per chunk as one tensor) and Megatron's `--tp-comm-overlap`
under FP8.

- `ring_float8_gathered_linears(shard, weights, biases, dim, comm, recipe)`: `float8_gathered_linears`,
  its forward gather and backward re-gather rings of the float8 shard, the input gradient's
  reduce-scatter a ring of its partial sums;
- `ring_float8_linear_reduce_scatter(x, weight, bias, dim, comm, recipe)`: `float8_linear_reduce_scatter`,
  the partial sums reduce-scattered in a ring, the output gradient's float8 shard gathered in one.

Every chunk is scaled with the scale of the whole tensor (a tensorwise scale is one number, agreed over
tp before the ring starts), so a chunk's GEMM reads exactly the float8 values the plain op's GEMM reads
of those rows; the chunks' weight-gradient products are summed in fp32. Results equal the plain float8
ops within the rounding of that sum and of the ring's order of adding the partial sums.

The ring steps are point-to-point sends, which dynamo does not trace: these are eager ops (as the bf16
rings are). So that their casts are not torchao's eager ones under --compile (`abs`, `max`, an fp32 copy,
`mul`, the saturating cast: a pass each), the program passes `compiled=True` there and each cast runs as
two compiled kernels, the amax and the scaled cast (ops/float8.py's `_cast_kernels`): what a compiled
float8 linear's casts cost, and how the planner prices both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..ir.op_kinds import OpKind, register_function_kind
from .async_tp import chunk, gather_ring, reduce_scatter_ring
from .eager import eager as _eager
from .float8 import _cast, _config
from .float8_gather import _cast_shard, _float8_gathered, row_forward_casts

if TYPE_CHECKING:
    from .tp_comm import TPComm


def _rows(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, recipe: tuple[str, bool], role: Any) -> Any:
    """Float8 bytes (any shape) as the 2-D Float8TrainingTensor of their rows, with their tensor's scale."""
    return _float8_gathered(data.reshape(-1, data.shape[-1]), scale, dtype, recipe, role)


def _ring_float8(data: torch.Tensor, comm: TPComm, direction: str, use: Any) -> None:
    """`gather_ring` of float8 bytes: each rank's chunk, moved as uint8 (a ring step only copies them)."""
    gather_ring(data.view(torch.uint8), comm, direction, lambda rank, got: use(rank, got.view(data.dtype)))


def _weight_cast(w: torch.Tensor, recipe: tuple[str, bool], comm: TPComm, direction: str, for_input_grad: bool,
                 compiled: bool) -> Any:
    from torchao.float8.float8_training_tensor import GemmInputRole

    c = _config(*recipe)
    config = c.cast_config_weight_for_grad_input if for_input_grad else c.cast_config_weight
    return _cast(w.t(), config, GemmInputRole.WEIGHT, -1 if for_input_grad else 0, 1, recipe, comm, direction,
                 compiled)


class _RingFloat8GatheredLinears(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, dim: int, comm: TPComm, recipe: tuple[str, bool], compiled: bool,
                *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        ctx.dim, ctx.comm, ctx.recipe, ctx.dtype, ctx.compiled = dim, comm, recipe, shard.dtype, compiled
        shard8 = _cast_shard(shard, recipe, comm, compiled)
        w8 = [_weight_cast(w, recipe, comm, "fwd", False, compiled) for w in weights]
        pieces: list[list[Any]] = [[None] * comm.size for _ in weights]

        def use(rank: int, data: torch.Tensor) -> None:  # a rank's float8 chunk: every linear's rows of it
            rows = _rows(data, shard8._scale, shard.dtype, recipe, GemmInputRole.INPUT)
            for i, w in enumerate(w8):
                pieces[i][rank] = torch.mm(rows, w).reshape(*data.shape[:-1], weights[i].shape[0])

        _ring_float8(shard8._data, comm, "forward", use)
        ctx.save_for_backward(shard8._data, shard8._scale, *weights)
        return tuple(torch.cat(p, dim) for p in pieces)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        data, scale, *weights = ctx.saved_tensors
        comm, recipe, dim, n, compiled = ctx.comm, ctx.recipe, ctx.dim, ctx.comm.size, ctx.compiled
        c = _config(*recipe)
        live = [i for i, g in enumerate(grads) if g is not None]
        gs = {i: grads[i].to(ctx.dtype) for i in live}
        want_w = [i for i in live if ctx.needs_input_grad[5 + i]]
        grad_w: list[torch.Tensor | None] = [None] * len(weights)
        if want_w:
            # each output gradient cast whole (its features are the column cut: the amax reduced over tp),
            # its chunk's rows read beside the shard's chunk as it arrives
            go8 = {i: _cast(gs[i], c.cast_config_grad_output_for_grad_weight, GemmInputRole.GRAD_OUTPUT, 0, 1,
                            recipe, comm, "bwd", compiled) for i in want_w}
            sums = {i: torch.zeros(weights[i].shape, dtype=torch.float32, device=data.device) for i in want_w}

            def use(rank: int, chunk8: torch.Tensor) -> None:
                rows = _rows(chunk8, scale, ctx.dtype, recipe, GemmInputRole.INPUT)
                for i in want_w:
                    g = _rows(chunk(go8[i]._data, dim, rank, n), go8[i]._scale, ctx.dtype, recipe,
                              GemmInputRole.GRAD_OUTPUT)
                    sums[i] += torch.mm(g.t(), rows).float()

            _ring_float8(data, comm, "backward", use)
            for i in want_w:
                grad_w[i] = sums[i].to(weights[i].dtype)
        grad_x = None
        if ctx.needs_input_grad[0] and live:
            go8 = {i: _cast(gs[i], c.cast_config_grad_output, GemmInputRole.GRAD_OUTPUT, -1, 1, recipe, comm, "bwd",
                            compiled) for i in live}
            w8 = {i: _weight_cast(weights[i], recipe, comm, "bwd", True, compiled) for i in live}

            def part(index: int) -> torch.Tensor:  # this rank's columns' share of a chunk's input gradient
                total = None
                for i in live:
                    g = chunk(go8[i]._data, dim, index, n)
                    rows = _rows(g, go8[i]._scale, ctx.dtype, recipe, GemmInputRole.GRAD_OUTPUT)
                    piece = torch.mm(rows, w8[i].t()).reshape(*g.shape[:-1], weights[i].shape[1])
                    total = piece if total is None else total + piece
                return total

            grad_x = reduce_scatter_ring(comm, "backward", part)
        return (grad_x, None, None, None, None, *grad_w)


class _RingFloat8RowReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int, comm: TPComm,
                recipe: tuple[str, bool], compiled: bool) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        n = comm.size
        x8, w8 = row_forward_casts(ctx, x, weight, bias, dim, comm, recipe, compiled)

        def part(index: int) -> torch.Tensor:  # each rank adds its share of the bias, as the plain op
            rows = chunk(x8._data, dim, index, n)
            out = torch.mm(_rows(rows, x8._scale, x.dtype, recipe, GemmInputRole.INPUT), w8)
            out = out.reshape(*rows.shape[:-1], weight.shape[0])
            return out if bias is None else out + bias.to(out.dtype)

        return reduce_scatter_ring(comm, "forward", part)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        x, weight = ctx.saved_tensors
        comm, recipe, dim, n, compiled = ctx.comm, ctx.recipe, ctx.dim, ctx.comm.size, ctx.compiled
        c = _config(*recipe)
        grad = grad.to(x.dtype)
        shard8 = _cast(grad, c.cast_config_grad_output, GemmInputRole.GRAD_OUTPUT, -1, 0, recipe, comm, "bwd",
                       compiled)
        want_x, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w8 = _cast(weight.t(), c.cast_config_weight_for_grad_input, GemmInputRole.WEIGHT, -1, 0, recipe, comm,
                   "bwd", compiled) if want_x else None
        x8 = _cast(x, c.cast_config_input_for_grad_weight, GemmInputRole.INPUT, 0, 1, recipe, comm,
                   "bwd", compiled) if want_w else None
        pieces: list[Any] = [None] * n
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None

        def use(rank: int, chunk8: torch.Tensor) -> None:  # the output gradient's float8 chunk of rank `rank`
            rows = _rows(chunk8, shard8._scale, grad.dtype, recipe, GemmInputRole.GRAD_OUTPUT)
            if w8 is not None:
                pieces[rank] = torch.mm(rows, w8.t()).reshape(*chunk8.shape[:-1], weight.shape[1])
            if grad_w is not None:
                xs = _rows(chunk(x8._data, dim, rank, n), x8._scale, x.dtype, recipe, GemmInputRole.INPUT)
                grad_w.add_(torch.mm(rows.t(), xs).float())

        _ring_float8(shard8._data, comm, "backward", use)
        grad_x = torch.cat(pieces, dim) if want_x else None
        grad_b = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = comm.all_reduce(grad.flatten(0, -2).sum(0), "bwd")  # the whole gradient's row sums
        return grad_x, grad_w.to(weight.dtype) if grad_w is not None else None, grad_b, None, None, None, None


def _low(t: torch.Tensor) -> torch.Tensor:
    """As Float8Linear: the input in autocast's dtype where autocast is on."""
    return t.to(torch.get_autocast_dtype(t.device.type)) if torch.is_autocast_enabled(t.device.type) else t


@torch.fx.wrap
@_eager
def ring_float8_gathered_linears(shard: torch.Tensor, weights: tuple[torch.Tensor, ...],
                                 biases: tuple[torch.Tensor | None, ...], dim: int, comm: TPComm,
                                 recipe: str, compiled: bool = False) -> tuple[torch.Tensor, ...]:
    """`float8_gathered_linears(shard, weights, biases, dim, comm, recipe)` with its gathers rings beside
    the float8 GEMMs (module docstring). `compiled` (the program runs under --compile): each float8 cast a
    compiled amax and a compiled scaled cast (ops/float8.py's `_cast_kernels`), not torchao's eager ops."""
    if shard.device.type == "meta":  # shapes and dtypes only: the high-precision linears'
        whole = comm.all_gather(shard, dim, None)
        return tuple(F.linear(whole, w, b) for w, b in zip(weights, biases))
    shard = _low(shard)
    outs = _RingFloat8GatheredLinears.apply(shard, dim, comm, (recipe, shard.device.type != "cuda"), compiled,
                                            *weights)
    return tuple(out if b is None else out + b.to(out.dtype) for out, b in zip(outs, biases))


@torch.fx.wrap
@_eager
def ring_float8_linear_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int,
                                      comm: TPComm, recipe: str, compiled: bool = False) -> torch.Tensor:
    """`float8_linear_reduce_scatter(x, weight, bias, dim, comm, recipe)` with its reduce-scatter and its
    backward float8 gather rings (module docstring); `compiled` as `ring_float8_gathered_linears`'s."""
    if x.device.type == "meta":
        return comm.local_slice(F.linear(x, weight, bias), dim)
    x = _low(x)
    return _RingFloat8RowReduceScatter.apply(x, weight, bias, dim, comm, (recipe, x.device.type != "cuda"), compiled)


register_function_kind(ring_float8_gathered_linears, OpKind.LINEAR)
register_function_kind(ring_float8_linear_reduce_scatter, OpKind.LINEAR)
