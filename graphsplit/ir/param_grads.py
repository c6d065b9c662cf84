"""Which parameters of a graph can get a gradient: the ops that cut gradients (`detach`) and run for
their effect (in place), read by the grad-mode pass, the stage builder and the ranks' stages alike.

A stage marks the parameters no op of it can give a gradient requires_grad=False (DDP would otherwise
wait for their gradients), and tied copies that are all such get no summed zero gradient.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .meta import info
from .walk import reachable

CALLS = ("call_function", "call_method", "call_module")


def mutates(node: fx.Node, name: str) -> bool:
    """In-place ops (a BatchNorm's `num_batches_tracked.add_(1)`) must run exactly once."""
    schema = getattr(node.target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return True
    return name.endswith("_") and not name.endswith("__")


def is_detach(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "detach") or (
        node.op == "call_function" and node.target in _DETACH_FUNCTIONS
    )


_DETACH_FUNCTIONS = {torch.Tensor.detach, torch.detach, torch.ops.aten.detach, torch.ops.aten.detach.default}


def params_without_grad(gm: fx.GraphModule) -> list[str]:
    """Names of `gm`'s parameters no op of it can give a gradient: frozen ones, and those
    whose every way to an output goes through a detach or a value of integers (read only under no_grad,
    feeding only a detached branch, or only an argmax). All names of a tied parameter, or none.

    A stage marks these requires_grad=False (DDP would otherwise wait for their gradients)
    and tied copies that are all such get no summed zero gradient. Conservative: an op run
    for its effect (in place, or unread) counts as reaching the output; graphs nested in
    called modules (checkpoint regions) are read as if all their outputs were used.
    """
    names: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, p in gm.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        params[id(p)] = p
    referenced: set[int] = set()
    reached: set[int] = set()
    for sub in gm.modules():
        if isinstance(sub, fx.GraphModule):
            _reaching_params(sub, referenced, reached)
    return [name for key, group in names.items()
            if not params[key].requires_grad or (key in referenced and key not in reached) for name in group]


def _reaching_params(gm: fx.GraphModule, referenced: set[int], reached: set[int]) -> None:
    """Add the ids of the parameters `gm` reads to `referenced`, and of those with a path to an
    output or to an op run for its effect that passes no detach, to `reached`."""

    def params_of(node: fx.Node) -> list[torch.nn.Parameter]:
        if node.op == "get_attr":
            try:
                return [gm.get_parameter(str(node.target))]
            except AttributeError:
                return []  # a buffer, a constant or a module
        if node.op == "call_module":
            called = gm.get_submodule(str(node.target))
            if not any(isinstance(m, fx.GraphModule) for m in called.modules()):  # else read on its own
                return list(called.parameters())
        return []

    ends = [n for n in gm.graph.nodes if n.op == "output" or (n.op in CALLS and (not n.users or in_place(n)))]
    for node in reachable(ends, lambda n: () if is_detach(n) or carries_no_grad(n) else n.all_input_nodes):
        if not carries_no_grad(node):
            reached.update(id(p) for p in params_of(node))
    for node in gm.graph.nodes:
        referenced.update(id(p) for p in params_of(node))


def carries_no_grad(node: fx.Node) -> bool:
    """A value of integers or truth values (an argmax, a comparison, a top-k's indices): no gradient flows
    back through it, so a router read only through `argmax` gets none (known from the analysis's dtypes;
    unknown: it may carry one)."""
    if node.op not in CALLS or info(node).value != "tensor" or info(node).tensor is None:
        return False
    dtype = info(node).tensor.dtype
    return not (dtype.is_floating_point or dtype.is_complex)


def in_place(node: fx.Node) -> bool:
    if node.op == "call_function" and node.target in _IN_PLACE_OPERATORS:
        return True
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))
    return node.op != "call_module" and mutates(node, name)


_IN_PLACE_OPERATORS = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
    operator.imatmul,
}
