"""What tracing gives: `Traced` (the graph, its flat inputs and how to rebuild the model's output),
and the graph edits both tracers (trace.py's torch.fx, trace_export.py's torch.export) share: a flat
output, baked-in non-tensor inputs, tensors the model's forward made marked as constants."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from .meta import fresh_copy, info

# NodeInfo.extra key of a get_attr node reading a tensor the model's forward made (`mark_constants`)
CONSTANT = "trace_constant"


@dataclass
class Traced:
    """A traced model: the graph plus how to feed it and read its output."""

    gm: fx.GraphModule
    tracer: str  # "fx" or "export"
    input_names: list[str]
    out_spec: pytree.TreeSpec
    _flatten: Any = field(repr=False)
    # the calls of the modules `trace_model(..., watch=)` named: name -> (args, kwargs, output), proxies
    # as their nodes (fx only; the planner's fold reads how its blocks were called)
    calls: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict, repr=False)
    # which tracer and why, for the summary: "torch.fx", with the size conditions it decided, or
    # "torch.export: torch.fx failed at model.py:33: ..."
    reason: str = ""
    # modules kept as one call_module node each because their forward branches on tensor values
    # (trace.run_as_written): they run as written on each micro-batch
    eager: tuple[str, ...] = ()

    def flatten_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        return tuple(self._flatten(args, kwargs))

    def unflatten_output(self, leaves: Any) -> Any:
        if isinstance(leaves, torch.Tensor):
            leaves = (leaves,)
        return pytree.tree_unflatten(list(leaves), self.out_spec)

    def copy(self) -> Traced:
        """A copy whose graph the passes may rewrite, this one left as traced: one trace serves several
        plans (tracing through torch.export costs seconds; a copy, milliseconds)."""
        return dataclasses.replace(self, gm=fresh_copy(self.gm))


def flat_output(graph: fx.Graph) -> pytree.TreeSpec:
    """Make the output node return a flat tuple of leaves; return the tree's spec."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    leaves, spec = pytree.tree_flatten(out.args[0])
    out.args = (tuple(leaves),)
    return spec


def split_leaves(leaves: Any) -> tuple[list[fx.Node], list[tuple[str, Any]]]:
    """The output node's leaves as (its distinct node leaves, and each leaf as ("tensor", i),
    the i-th of those, or ("const", value)): a value returned twice is sent once."""
    nodes: list[fx.Node] = []
    kinds: list[tuple[str, Any]] = []
    for leaf in leaves:
        if isinstance(leaf, fx.Node):
            if leaf not in nodes:
                nodes.append(leaf)
            kinds.append(("tensor", nodes.index(leaf)))
        else:
            kinds.append(("const", leaf))
    return nodes, kinds


def fill_leaves(kinds: list[tuple[str, Any]], values: Any) -> list[Any]:
    """The output's leaves again, from `split_leaves`' kinds and the values of its node leaves."""
    return [values[v] if kind == "tensor" else v for kind, v in kinds]


def mark_constants(gm: fx.GraphModule, model: nn.Module, attributes: frozenset[str] = frozenset()) -> None:
    """Mark the get_attr nodes of tensors forward made (`torch.ones(sz, sz)`: fx's `_tensor_constant0`,
    export's lifted constants): no weight of the model, though a GraphModule registers each as a
    buffer (again at every copy), so the program carries their values instead of looking them up in
    the weights (ir/program.py). `attributes`: plain tensor attributes registered as buffers for the
    trace (module_state.attributes_as_buffers), constants too."""
    own = {name for name, _ in (*model.named_parameters(remove_duplicate=False),
                                *model.named_buffers(remove_duplicate=False))} - attributes
    for node in gm.graph.find_nodes(op="get_attr"):
        if node.target not in own and isinstance(operator.attrgetter(str(node.target))(gm), torch.Tensor):
            info(node).extra[CONSTANT] = True


def bake(placeholder: fx.Node, value: Any) -> None:
    """Every use of an input the graph is specialized to reads its value instead."""
    for user in list(placeholder.users):
        user.replace_input_with(placeholder, value)
