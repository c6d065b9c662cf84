"""Sequence parallelism's gathered tokens in float8: cast once on the shard, all-gathered in float8,
read by every float8 column linear (`--fp8 tensorwise` with `--sequence-parallel`).

Under sequence parallelism each column-parallel linear (q, k, v; gate, up) reads the tokens every tp
rank's shard gathered, and a float8 linear casts what it reads: each cast its own pass over the
gathered tokens, the gather itself in the high dtype. torchao's float8 tensor parallelism
(`PrepareFloat8ModuleInput` with `Float8ColwiseParallel`, as torchtitan runs it) casts the shard before
the gather and gathers float8: one cast of 1/tp of the tokens, one gather of a byte per element, for
all the linears. `float8_gathered_linears(shard, weights, biases, dim, comm, recipe)` does that:

- the tensorwise scale is the whole gathered tensor's: each rank's amax of its shard, all-reduced (max)
  over tp, is the amax the untouched linear takes of the tokens, so casting the shard with it and
  gathering is casting the gathered tokens, element for element (the same float8 values, the same
  scale: `--check` compares with the untouched model's torchao linears);
- each linear's weight and output gradient are cast as `ops/float8.float8_linear` casts them;
- the float8 shard is what backward keeps (a byte per element; the tensorwise recipe casts the input
  for the weight's gradient with the same scale, so these are the values it would cast again), gathered
  once more in float8 for all the weights' gradients; the input's gradient, summed over the linears, is
  reduce-scattered in the shard's dtype, as `gather_for_column`'s backward does.

It is not an eager op (as the other tp collectives are): under --compile dynamo traces its gather and
amax all-reduce (the communicator keeps no counts while it traces), so its casts fuse as a float8
linear's do, and the weights' casts run once per micro-batch in compiled code.

Rowwise scales along the tokens' features for the forward GEMM but along the tokens for the weight's
gradient, which a shard of tokens cannot give: torchao gathers rowwise tensors in the high dtype, and
so does graphsplit (passes/float8.py rewrites tensorwise sites only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..ir.op_kinds import OpKind, register_function_kind
from .float8 import _cast, _config, _mm_config

if TYPE_CHECKING:
    from .tp_comm import TPComm

_COLUMN = {"input": None, "weight": 1, "grad_output": 1}  # ops/float8.py's column cut


def _gather_float8(data: torch.Tensor, dim: int, comm: TPComm, direction: str) -> torch.Tensor:
    """Every rank's float8 shard gathered along `dim`, moved as bytes (no backend reduces float8; a
    gather only copies them)."""
    return comm.all_gather(data.view(torch.uint8), dim, direction).view(data.dtype)


def _cast_shard(shard: torch.Tensor, recipe: tuple[str, bool], comm: TPComm, compiled: bool = False) -> Any:
    """The shard in float8 with the scale of the whole gathered tensor (amax all-reduced over tp)."""
    from torchao.float8.float8_training_tensor import GemmInputRole

    return _cast(shard, _config(*recipe).cast_config_input, GemmInputRole.INPUT, -1, 0, recipe, comm, "fwd", compiled)


def _float8_gathered(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, recipe: tuple[str, bool],
                     role: Any) -> Any:
    """Gathered float8 bytes as a Float8TrainingTensor, with the scale their shard was cast with."""
    from torchao.float8.float8_training_tensor import Float8TrainingTensor

    return Float8TrainingTensor(data, scale, dtype, _mm_config(*recipe), role)


class _Float8GatheredLinears(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, dim: int, comm: TPComm, recipe: tuple[str, bool], count: int,
                *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        c = _config(*recipe)
        ctx.dim, ctx.comm, ctx.recipe, ctx.dtype = dim, comm, recipe, shard.dtype
        shard8 = _cast_shard(shard, recipe, comm)
        x8 = _float8_gathered(_gather_float8(shard8._data, dim, comm, "forward"), shard8._scale, shard.dtype, recipe,
                              GemmInputRole.INPUT)
        rows = x8.reshape(-1, x8.shape[-1])
        outs = []
        for w in weights:
            w8 = _cast(w.t(), c.cast_config_weight, GemmInputRole.WEIGHT, 0, _COLUMN["weight"], recipe, comm, "fwd")
            outs.append(torch.mm(rows, w8).reshape(*x8.shape[:-1], w.shape[0]))
        ctx.save_for_backward(shard8._data, shard8._scale, *weights)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        data, scale, *weights = ctx.saved_tensors
        comm, recipe, dim = ctx.comm, ctx.recipe, ctx.dim
        c = _config(*recipe)
        live = [i for i, g in enumerate(grads) if g is not None]
        want_w = [i for i in live if ctx.needs_input_grad[5 + i]]
        grad_w: list[torch.Tensor | None] = [None] * len(weights)
        if want_w:
            x8 = _float8_gathered(_gather_float8(data, dim, comm, "backward"), scale, ctx.dtype, recipe,
                                  GemmInputRole.INPUT)
            rows = x8.reshape(-1, x8.shape[-1])
            for i in want_w:
                go = grads[i].to(ctx.dtype).reshape(-1, grads[i].shape[-1])
                go8 = _cast(go, c.cast_config_grad_output_for_grad_weight, GemmInputRole.GRAD_OUTPUT, 0,
                            _COLUMN["grad_output"], recipe, comm, "bwd")
                grad_w[i] = torch.mm(go8.t(), rows).to(weights[i].dtype)
        grad_x = None
        if ctx.needs_input_grad[0] and live:
            total = None
            for i in live:
                g = grads[i].to(ctx.dtype)
                go8 = _cast(g.reshape(-1, g.shape[-1]), c.cast_config_grad_output, GemmInputRole.GRAD_OUTPUT, -1,
                            _COLUMN["grad_output"], recipe, comm, "bwd")
                w8 = _cast(weights[i].t(), c.cast_config_weight_for_grad_input, GemmInputRole.WEIGHT, -1,
                           _COLUMN["weight"], recipe, comm, "bwd")
                part = torch.mm(go8, w8.t()).reshape(*g.shape[:-1], weights[i].shape[1])
                total = part if total is None else total + part
            grad_x = comm.reduce_scatter(total, dim, "backward")
        return (grad_x, None, None, None, None, *grad_w)


@torch.fx.wrap
def float8_gathered_linears(shard: torch.Tensor, weights: tuple[torch.Tensor, ...],
                            biases: tuple[torch.Tensor | None, ...], dim: int, comm: TPComm,
                            recipe: str) -> tuple[torch.Tensor, ...]:
    """`tuple(float8_linear(gather(shard, dim), w, b) for w, b in zip(weights, biases))` with the tokens
    cast once on the shard and gathered in float8 (module docstring); keeps the float8 shard."""
    if shard.device.type == "meta":  # shapes and dtypes only: the high-precision linears'
        whole = comm.all_gather(shard, dim, None)
        return tuple(F.linear(whole, w, b) for w, b in zip(weights, biases))
    if torch.is_autocast_enabled(shard.device.type):  # as Float8Linear: the input in autocast's dtype
        shard = shard.to(torch.get_autocast_dtype(shard.device.type))
    outs = _Float8GatheredLinears.apply(shard, dim, comm, (recipe, shard.device.type != "cuda"), len(weights),
                                        *weights)
    return tuple(out if b is None else out + b.to(out.dtype) for out, b in zip(outs, biases))


register_function_kind(float8_gathered_linears, OpKind.LINEAR)


def row_forward_casts(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int,
                      comm: TPComm, recipe: tuple[str, bool], compiled: bool = False) -> tuple[Any, Any]:
    """A float8 row linear's forward set-up (this module's and ops/float8_ring.py's): what backward reads
    kept on `ctx`, the input and weight cast with their amax reduced over tp (the input features are the
    cut)."""
    from torchao.float8.float8_training_tensor import GemmInputRole

    c = _config(*recipe)
    ctx.dim, ctx.comm, ctx.recipe, ctx.has_bias, ctx.compiled = dim, comm, recipe, bias is not None, compiled
    ctx.save_for_backward(x, weight)
    x8 = _cast(x, c.cast_config_input, GemmInputRole.INPUT, -1, _ROW["input"], recipe, comm, "fwd", compiled)
    w8 = _cast(weight.t(), c.cast_config_weight, GemmInputRole.WEIGHT, 0, _ROW["weight"], recipe, comm, "fwd", compiled)
    return x8, w8


class _Float8RowReduceScatter(torch.autograd.Function):
    """`reduce_scatter(float8_linear(x, weight, bias, "row"))` whose backward gathers the output's gradient in
    float8: each rank casts its shard of the gradient with the amax all-reduced over tp (the whole gradient's
    scale, as the plain linear takes it of the gathered gradient), the bytes are gathered, and both GEMMs
    read them (tensorwise casts the gradient for the weight's gradient with the same scale)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int, comm: TPComm,
                recipe: tuple[str, bool]) -> torch.Tensor:
        x8, w8 = row_forward_casts(ctx, x, weight, bias, dim, comm, recipe)
        out = torch.mm(x8.reshape(-1, x.shape[-1]), w8).reshape(*x.shape[:-1], weight.shape[0])
        if bias is not None:
            out = out + bias.to(out.dtype)
        return comm.reduce_scatter(out, dim, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        x, weight = ctx.saved_tensors
        comm, recipe, dim = ctx.comm, ctx.recipe, ctx.dim
        c = _config(*recipe)
        grad = grad.to(x.dtype)
        shard8 = _cast(grad, c.cast_config_grad_output, GemmInputRole.GRAD_OUTPUT, -1, 0, recipe, comm, "bwd")
        g8 = _float8_gathered(_gather_float8(shard8._data, dim, comm, "backward"), shard8._scale, grad.dtype, recipe,
                              GemmInputRole.GRAD_OUTPUT)
        rows = g8.reshape(-1, g8.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            w8 = _cast(weight.t(), c.cast_config_weight_for_grad_input, GemmInputRole.WEIGHT, -1, _ROW["weight"],
                       recipe, comm, "bwd")
            grad_x = torch.mm(rows, w8.t()).reshape(*g8.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            x8 = _cast(x.reshape(-1, x.shape[-1]), c.cast_config_input_for_grad_weight, GemmInputRole.INPUT, 0,
                       _ROW["input"], recipe, comm, "bwd")
            grad_w = torch.mm(rows.t(), x8).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # the whole gradient's sum over its rows: each rank's shard's, summed over tp
            grad_b = comm.all_reduce(grad.flatten(0, -2).sum(0), "bwd")
        return grad_x, grad_w, grad_b, None, None, None


_ROW = {"input": 1, "weight": 0, "grad_output": None}  # ops/float8.py's row cut


@torch.fx.wrap
def float8_linear_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int,
                                 comm: TPComm, recipe: str) -> torch.Tensor:
    """`reduce_scatter_to_tp(float8_linear(x, weight, bias, comm, recipe, "row"), dim)`, the output's gradient
    gathered in float8 (tensorwise; `_Float8RowReduceScatter`)."""
    if x.device.type == "meta":
        return comm.local_slice(F.linear(x, weight, bias), dim)
    if torch.is_autocast_enabled(x.device.type):  # as Float8Linear: the input in autocast's dtype
        x = x.to(torch.get_autocast_dtype(x.device.type))
    return _Float8RowReduceScatter.apply(x, weight, bias, dim, comm, (recipe, x.device.type != "cuda"))


register_function_kind(float8_linear_reduce_scatter, OpKind.LINEAR)
