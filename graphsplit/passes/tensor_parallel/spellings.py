"""Reading and editing ops in whichever spelling the tracer produced (fx or ATen).

`linear_form` is the one place that knows where the input, weight and bias of a
linear sit in `F.linear`, `aten.linear`, `addmm`, `mm` (and sequence parallelism's
`column_linear_from_seq_shard`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from ...ir.op_kinds import op_name
from ...ir.sharding import Shard
from ...ops import tp as tpops
from ...ops.float8 import float8_linear

aten = torch.ops.aten


def arg_of(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


_REDUCTIONS = ("none", "mean", "sum")  # ATen's reduction enum


def cross_entropy_options(node: fx.Node) -> tuple[Any, str, int, float]:
    """(weight, reduction, ignore_index, label_smoothing) of a cross-entropy in either spelling:
    `F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction,
    label_smoothing)` or torch.export's `aten.cross_entropy_loss(self, target, weight, reduction (0 none,
    1 mean, 2 sum), ignore_index, label_smoothing)` (HF's `labels=` loss)."""
    if op_name_of(node) == "cross_entropy_loss":
        reduction = arg_of(node, 3, "reduction", 1)
        return (arg_of(node, 2, "weight"), _REDUCTIONS[reduction] if isinstance(reduction, int) else str(reduction),
                arg_of(node, 4, "ignore_index", -100), arg_of(node, 5, "label_smoothing", 0.0))
    return (arg_of(node, 2, "weight"), arg_of(node, 6, "reduction", "mean"), arg_of(node, 4, "ignore_index", -100),
            arg_of(node, 7, "label_smoothing", 0.0))


def vocab_parallel_loss(node: fx.Node, have: Any, shape: tuple[int, ...] | None) -> bool:
    """Whether the cross-entropy `node` over logits of `shape` held as `have` is one the vocab-parallel loss
    computes (rules/cross_entropy.py): [tokens, vocab] cut plainly along the vocabulary, no class weights,
    no label smoothing."""
    weight, reduction, _, smoothing = cross_entropy_options(node)
    return shape is not None and len(shape) == 2 and isinstance(have, Shard) and have.dim == 1 \
        and not have.chunks and weight is None and not smoothing and reduction in ("mean", "sum", "none")


def with_arg(node: fx.Node, index: int, name: str, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`node`'s (args, kwargs) with argument `index` (keyword `name`) replaced by `value`."""
    if len(node.args) > index:
        args = list(node.args)
        args[index] = value
        return tuple(args), dict(node.kwargs)
    return tuple(node.args), {**node.kwargs, name: value}


def op_name_of(node: fx.Node) -> str:
    """`op_name` without an in-place suffix: `add` for `add_`."""
    name = op_name(node)
    return name.rstrip("_") if not name.startswith("_") else name


def describe(node: fx.Node) -> str:
    return f"{op_name_of(node)} ({node.name})"


def is_param(gm: fx.GraphModule, node: fx.Node) -> bool:
    try:
        gm.get_parameter(str(node.target))
        return True
    except AttributeError:
        return False


def linear_form(node: fx.Node) -> tuple[Any, Any, Any, int, int] | None:
    """(input, weight, bias, weight's out dim, weight's in dim) for each spelling of a linear."""
    t = node.target
    if node.op == "call_function" and (t is F.linear or t in (aten.linear.default,)):
        return node.args[0], node.args[1], arg_of(node, 2, "bias"), 0, 1
    if isinstance(t, torch._ops.OpOverload) and t.overloadpacket in (aten.addmm,):
        return node.args[1], node.args[2], node.args[0], 1, 0
    if t is torch.addmm:
        return node.args[1], node.args[2], node.args[0], 1, 0
    if isinstance(t, torch._ops.OpOverload) and t.overloadpacket in (aten.mm,) or t is torch.mm:
        return node.args[0], node.args[1], None, 1, 0
    if t is float8_linear:  # (x, weight, bias, comm, recipe, style)
        return node.args[0], node.args[1], node.args[2], 0, 1
    if t is tpops.column_linear_from_seq_shard:  # (gathered, shard, weight, bias, dim, comm)
        return node.args[0], node.args[2], node.args[3], 0, 1
    return None


# a parameter's casts a linear may read it through (whisper's `F.linear(x, self.weight.to(x.dtype))`)
_WEIGHT_CASTS = frozenset({"to", "_to_copy", "float", "half", "bfloat16", "double", "type_as", "contiguous"})


def param_behind(value: Any) -> fx.Node | None:
    """The parameter's get_attr `value` is, or is a cast of read by one op alone (a chain of `.to(dtype)`,
    `.float()`, `.type_as(x)`, `.contiguous()`): sharding the parameter shards the casts with it. None
    for anything else (a weight computed in forward: a transpose, a sum, a cast read twice)."""
    node = value
    while isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and op_name_of(node) in _WEIGHT_CASTS \
            and len(node.users) == 1 and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node if isinstance(node, fx.Node) and node.op == "get_attr" else None


def grouped_linear_form(node: fx.Node) -> tuple[Any, fx.Node, int, int] | None:
    """(input, the parameter's get_attr, its out dim, its in dim) for a grouped linear
    `grouped_mm(x [S, in], w [E, in, out], offsets)` whose `w` is a parameter held as
    [E, in, out], or as [E, out, in] read through `transpose(-2, -1)` (HF's experts)."""
    w = node.args[1] if len(node.args) > 1 else None
    if not isinstance(w, fx.Node):
        return None
    if w.op == "get_attr":
        return node.args[0], w, 2, 1
    if (op_name_of(w) == "transpose" and len(w.args) == 3 and isinstance(w.args[0], fx.Node)
            and w.args[0].op == "get_attr" and sorted(d % 3 for d in w.args[1:]) == [1, 2]):
        return node.args[0], w.args[0], 1, 2
    return None


def _is_addmm(node: fx.Node) -> bool:
    return node.target is torch.addmm or getattr(node.target, "overloadpacket", None) is aten.addmm


def without_bias(node: fx.Node) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(target, args, kwargs) of the linear `node` computing no bias (`addmm` becomes `mm`)."""
    if _is_addmm(node):
        target = aten.mm.default if isinstance(node.target, torch._ops.OpOverload) else torch.mm
        return target, (node.args[1], node.args[2]), {}
    return node.target, tuple(node.args[:2]), {k: v for k, v in node.kwargs.items() if k != "bias"}


def split_sizes(node: fx.Node, dim_size: int) -> list[int] | None:
    name = op_name_of(node)
    arg = node.args[1] if len(node.args) > 1 else node.kwargs.get("split_size_or_sections", node.kwargs.get("chunks"))
    if name == "chunk":
        if not isinstance(arg, int) or dim_size % arg:
            return None
        return [dim_size // arg] * arg
    if isinstance(arg, int):
        return [arg] * (dim_size // arg) + ([dim_size % arg] if dim_size % arg else [])
    if isinstance(arg, (list, tuple)) and all(isinstance(x, int) for x in arg):
        return list(arg)
    return None


# norm -> argument positions of (weight, bias): they normalize each row over the trailing
# `normalized_shape` dims, so rows may sit on any rank
ROW_NORMS = {
    F.layer_norm: (2, 3), torch.ops.aten.layer_norm.default: (2, 3),
    F.rms_norm: (2,), torch.ops.aten.rms_norm.default: (2,),
}


def einsum_operands(node: fx.Node) -> tuple[str, list[Any]] | None:
    """(equation, operands) of an einsum in any spelling: `torch.einsum(eq, a, b)`, `torch.einsum(eq, [a,
    b])`, `aten.einsum(eq, [a, b], path)`."""
    if not node.args or not isinstance(node.args[0], str):
        return None
    rest = node.args[1:]
    operands = list(rest[0]) if len(rest) >= 1 and isinstance(rest[0], (list, tuple)) else list(rest)
    return node.args[0], operands
