"""FP8 linears, as torchao's float8 training computes them, with scales that agree across tp shards.

`float8_linear(x, weight, bias, comm, recipe, style)` is torchao's `Float8Linear.forward` for one
linear of the graph (`torchao.float8`: `Float8LinearConfig.from_recipe_name(recipe)`, the same casts,
the same three GEMMs through `torch._scaled_mm`): each operand is cast to float8 with a dynamic
scale from its amax, the input and weight to e4m3, the output gradient to e5m2.

What graphsplit adds is the tensor-parallel part. A scale is `max / amax` over the values it scales:
the whole tensor (tensorwise) or each row along one axis (rowwise). When that axis (or any axis,
for tensorwise) is the one a tp shard cuts, each rank's local amax is only part of it, and the
shards would be scaled differently from the one tensor the untouched model scales; so the amax is
all-reduced (max) over the tp group there, and only there (`_reduced`). A column-parallel linear
(its output features sharded) reduces its weight's and output gradient's amax; a row-parallel one
(its input features sharded) its input's and weight's. Each is a scalar, or one value per row.

Activation scales follow the values a rank holds: per micro-batch and per dp replica (as torchao's
are under DDP or FSDP); weight scales are the whole weight's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..errors import GraphsplitError

if TYPE_CHECKING:
    from .tp_comm import TPComm

RECIPES = ("tensorwise", "rowwise")
STYLES = ("column", "row", "replicated")
# the dim of each 2-D GEMM operand a tp shard cuts, by the linear's style: the input (M, K), the
# transposed weight (K, N) and the output gradient (M, N)
_SHARDED: dict[str, dict[str, int | None]] = {
    "column": {"input": None, "weight": 1, "grad_output": 1},
    "row": {"input": 1, "weight": 0, "grad_output": None},
    "replicated": {"input": None, "weight": None, "grad_output": None},
}


def import_torchao() -> None:
    """torchao's float8, imported quietly: on import it reports each optional kernel library this
    machine cannot load (CUDA ones on a CPU machine), which says nothing about float8 training."""
    import contextlib
    import io
    import logging

    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import torchao.float8  # noqa: F401
    except ImportError:
        raise GraphsplitError("--fp8 trains with torchao's float8 linears: pip install torchao") from None
    finally:
        logging.disable(logging.NOTSET)


def _build_config(recipe: str, emulate: bool) -> Any:
    import dataclasses

    import_torchao()
    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def _build_mm_config(c: Any) -> Any:
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig

    return LinearMMConfig(
        ScaledMMConfig(c.emulate, c.gemm_config_output.use_fast_accum, False, c.pad_inner_dim),
        ScaledMMConfig(c.emulate, c.gemm_config_grad_input.use_fast_accum, False, c.pad_inner_dim),
        ScaledMMConfig(c.emulate, c.gemm_config_grad_weight.use_fast_accum, False, c.pad_inner_dim),
    )


# (recipe, emulate) -> (torchao's config, its GEMM settings as `Float8Linear.__init__` builds them). Read
# by a plain dict lookup, which torch.compile traces as a constant; building one imports torchao and
# silences its logging, which dynamo cannot trace (a graph break at every cast: measured on an H200, the
# compiled fp8 stage ran 2.1x slower than torchao's), so `prime` builds them before a stage is compiled
_CONFIGS: dict[tuple[str, bool], tuple[Any, Any]] = {}


def _configs(recipe: str, emulate: bool = False) -> tuple[Any, Any]:
    found = _CONFIGS.get((recipe, emulate))
    if found is None:
        c = _build_config(recipe, emulate)
        found = _CONFIGS[(recipe, emulate)] = (c, _build_mm_config(c))
    return found


def _config(recipe: str, emulate: bool = False) -> Any:
    """torchao's config for `recipe`; `emulate`: its GEMMs in float32 on the float8 values (off a GPU:
    exact, where CPU's `_scaled_mm` rounds a row-scaled product's partial sums its own way)."""
    return _configs(recipe, emulate)[0]


def _mm_config(recipe: str, emulate: bool = False) -> Any:
    """torchao's GEMM settings for the recipe."""
    return _configs(recipe, emulate)[1]


def prime(module: Any) -> None:
    """Build the configs every float8 linear of `module` (an fx GraphModule, or a module holding them)
    will read, before torch.compile traces it."""
    import torch.fx as fx

    for sub in module.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        devices = {p.device.type for p in sub.parameters()} or {"cpu"}
        for node in sub.graph.nodes:
            if node.op == "call_function" and node.target is float8_linear:
                for device in devices:
                    _configs(node.args[4], device != "cuda")


def _reduced(cast_config: Any, axis: int, sharded: int | None) -> bool:
    """Whether the amax of an operand whose dim `sharded` is cut by tp must be reduced over tp."""
    from torchao.float8.config import ScalingGranularity

    if sharded is None:
        return False
    if cast_config.scaling_granularity is ScalingGranularity.TENSORWISE:
        return True
    return axis % 2 == sharded  # rowwise: the amax runs along `axis`


def _cast(t: torch.Tensor, cast_config: Any, role: Any, axis: int, sharded: int | None, recipe: tuple[str, bool],
          comm: TPComm | None, direction: str, compiled: bool = False) -> torch.Tensor:
    """`t` in float8 as torchao's `hp_tensor_to_float8_dynamic` casts it, its amax reduced over tp where
    the shard cuts what the scale covers. `compiled`: the amax and the scaled cast each one compiled
    kernel (`_cast_kernels`), for casts inside an eager op of a compiled program (ops/float8_ring.py)."""
    from torchao.float8.config import ScalingGranularity, ScalingType
    from torchao.float8.float8_scaling_utils import get_maybe_axiswise_dim
    from torchao.float8.float8_training_tensor import (
        Float8TrainingTensor,
        hp_tensor_and_scale_to_float8,
    )
    from torchao.float8.float8_utils import amax_to_scale, tensor_to_amax

    if cast_config.scaling_type is ScalingType.DISABLED:
        return t
    axiswise_dim = get_maybe_axiswise_dim(axis, cast_config.scaling_granularity)
    kernels = _cast_kernels() if compiled and cast_config.scaling_granularity is ScalingGranularity.TENSORWISE \
        else None
    if kernels is None:
        amax = tensor_to_amax(t, False, None, cast_config.scaling_granularity, axiswise_dim)
    else:
        # the kernels see one flat contiguous tensor (a weight's transpose read as the weight), so that
        # shapes, ranks and layouts do not each compile a kernel of their own: a tensorwise scale is blind to
        # them all. Detached last: nothing records a graph here (inside an autograd Function), and to dynamo
        # `flat` is then no view of a base whose sizes and strides it would guard, nor a leaf whose
        # requires_grad it would
        flip = t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()
        base = t.t() if flip else t.contiguous()
        flat = base.view(-1).detach()
        amax = kernels[0](flat)
    if comm is not None and comm.size > 1 and _reduced(cast_config, axis, sharded):
        amax = comm.all_reduce(amax, direction, op=dist.ReduceOp.MAX)
    scale = amax_to_scale(amax, cast_config.target_dtype, _config(*recipe).round_scales_to_power_of_2)
    if kernels is None:
        return hp_tensor_and_scale_to_float8(t, scale, cast_config.target_dtype, _mm_config(*recipe), role,
                                             axiswise_dim)
    # the values `hp_tensor_and_scale_to_float8` makes, without its autograd node
    data = kernels[1](flat, scale, cast_config.target_dtype).view(base.shape)
    return Float8TrainingTensor(data.t() if flip else data, scale, t.dtype, _mm_config(*recipe), role, None)


_KERNELS: list[tuple[Any, Any]] = []


def _cast_kernels() -> tuple[Any, Any]:
    """torchao's amax and its scaled float8 cast, each compiled by torch.compile into one kernel: one pass
    over the operand for the amax, one reading it and writing a byte an element (eagerly, `abs`, `max`,
    the fp32 copy, `mul` and the saturating cast each make a pass of their own). The scale between them,
    a few scalar ops, stays eager: the same division as the plain cast's, so the same float8 values."""
    if not _KERNELS:
        from torchao.float8.float8_utils import to_fp8_saturated

        def amax(flat: torch.Tensor) -> torch.Tensor:
            return torch.max(torch.abs(flat))  # torchao's tensorwise `tensor_to_amax`

        def scaled(flat: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return to_fp8_saturated(flat.to(torch.float32) * scale, dtype)

        _KERNELS.append((torch.compile(amax, dynamic=True), torch.compile(scaled, dynamic=True)))
    return _KERNELS[0]


class _Float8MatMul(torch.autograd.Function):
    """`input @ weight_t` with every operand of the three GEMMs in float8 (torchao's
    `matmul_with_hp_or_float8_args`, with tp-consistent scales)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight_t: torch.Tensor, comm: TPComm | None, recipe: tuple[str, bool],
                style: str, shard: torch.Tensor | None = None, dim: int = 0) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        # sequence parallelism's gathering linear: `x` is `shard` all-gathered along `dim`; the shard is kept
        # for backward and gathered again there for the weight's gradient (ops/tp.py's
        # column_linear_from_seq_shard), tp times less than `x`
        ctx.save_for_backward(x if shard is None else shard, weight_t)
        ctx.comm, ctx.recipe, ctx.style, ctx.dim, ctx.gathers = comm, recipe, style, dim, shard is not None
        c, cut = _config(*recipe), _SHARDED[style]
        x8 = _cast(x, c.cast_config_input, GemmInputRole.INPUT, -1, cut["input"], recipe, comm, "fwd")
        w8 = _cast(weight_t, c.cast_config_weight, GemmInputRole.WEIGHT, 0, cut["weight"], recipe, comm, "fwd")
        out = torch.mm(x8.reshape(-1, x.shape[-1]), w8)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        x, weight_t = ctx.saved_tensors
        comm, recipe = ctx.comm, ctx.recipe
        if ctx.gathers:
            x = comm.all_gather(x, ctx.dim, "backward")
        c, cut = _config(*recipe), _SHARDED[ctx.style]
        go = grad_output.reshape(-1, grad_output.shape[-1])
        go8 = _cast(go, c.cast_config_grad_output, GemmInputRole.GRAD_OUTPUT, -1, cut["grad_output"], recipe, comm, "bwd")
        w8 = _cast(weight_t, c.cast_config_weight_for_grad_input, GemmInputRole.WEIGHT, -1, cut["weight"], recipe,
                   comm, "bwd")
        grad_input = torch.mm(go8, w8.t()).reshape(*grad_output.shape[:-1], weight_t.shape[0])
        go8_w = _cast(go, c.cast_config_grad_output_for_grad_weight, GemmInputRole.GRAD_OUTPUT, 0,
                      cut["grad_output"], recipe, comm, "bwd")
        x8_w = _cast(x.reshape(-1, x.shape[-1]), c.cast_config_input_for_grad_weight, GemmInputRole.INPUT, 0,
                     cut["input"], recipe, comm, "bwd")
        grad_weight = torch.mm(go8_w.t(), x8_w)
        return grad_input, grad_weight.t(), None, None, None, None, None


def float8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, comm: TPComm | None,
                  recipe: str, style: str, shard: torch.Tensor | None = None, dim: int = 0) -> torch.Tensor:
    """`F.linear(x, weight, bias)` in float8 (torchao's recipe `recipe`); `style`: how tp cuts this
    linear (column, row, replicated), `comm` the tp communicator (None without tp). `shard`: sequence
    parallelism's column linear, `x` being `shard` gathered along `dim` (kept instead of `x`)."""
    if x.device.type == "meta":  # shapes and dtypes only: the high-precision linear's
        return F.linear(x, weight, bias)
    if torch.is_autocast_enabled(x.device.type):  # as Float8Linear: the input in autocast's dtype
        x = x.to(torch.get_autocast_dtype(x.device.type))
        shard = shard.to(x.dtype) if shard is not None else None
    out = _Float8MatMul.apply(x, weight.t(), comm, (recipe, x.device.type != "cuda"), style, shard, dim)
    return out if bias is None else out + bias.to(out.dtype)
