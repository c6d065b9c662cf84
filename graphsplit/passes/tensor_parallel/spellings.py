"""Reading and editing ops in whichever spelling the tracer produced (fx or ATen).

`linear_form` is the one place that knows where the input, weight and bias of a
linear sit in `F.linear`, `aten.linear`, `addmm` and `mm`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

aten = torch.ops.aten


def arg_of(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def set_arg(node: fx.Node, index: int, name: str, value: Any) -> None:
    if len(node.args) > index:
        args = list(node.args)
        args[index] = value
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, name: value}


def op_name_of(node: fx.Node) -> str:
    from ...ir.optable import _op_name

    name = _op_name(node)
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
    return None


def set_linear_input(node: fx.Node, x: fx.Node) -> None:
    args = list(node.args)
    pos = 1 if (node.target is torch.addmm or getattr(node.target, "overloadpacket", None) is aten.addmm) else 0
    args[pos] = x
    node.args = tuple(args)


def set_linear_weight(node: fx.Node, w: fx.Node) -> None:
    args = list(node.args)
    pos = 2 if (node.target is torch.addmm or getattr(node.target, "overloadpacket", None) is aten.addmm) else 1
    args[pos] = w
    node.args = tuple(args)


def drop_linear_bias(node: fx.Node) -> None:
    if node.target is torch.addmm or getattr(node.target, "overloadpacket", None) is aten.addmm:
        node.target = aten.mm.default if isinstance(node.target, torch._ops.OpOverload) else torch.mm
        node.args = (node.args[1], node.args[2])
        node.kwargs = {}
    else:
        node.args = tuple(node.args[:2])
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "bias"}


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
