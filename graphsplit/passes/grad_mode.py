"""Grad-mode regions, kept op by op.

torch.fx records no node for `with torch.no_grad():`, `torch.inference_mode()`,
`@torch.no_grad()` on a forward or `torch.enable_grad()`: the tracer marks each op
with the mode it ran in (`NodeInfo.grad_enabled`, ir/trace.py; export's regions are
inlined with the same mark). The program runs every op with grad enabled, so this
pass gives each grad-disabled op detached inputs wherever an input needs a
gradient. The op then records no autograd history, saves nothing for backward and
trains no parameter, exactly as in the untouched model; ops computed only from
such values need no detach of their own, and an enable_grad region inside no_grad
computes with grad from its (detached) inputs, as torch does::

    with torch.no_grad():             frozen_weight_1 = frozen_weight.detach()  # ... bias, x too
        h = self.frozen(x)      ->    h = linear(x_1, frozen_weight_1, frozen_bias_1)
    y = self.head(h)                  y = linear(h, head_weight, head_bias)

Python's indexing of a tuple (`q, k = parts`) is no autograd op and is left as it
is. An in-place op (`h.clamp_(0, 1)`, `x += 1`) mutates the detached alias, which
shares the storage, and its result is the original tensor again, as in torch.
What cannot be kept so is refused with the model's line: an op taking a whole
container of values that need gradients.

Runs first, on the graph as traced: later passes see the detaches as ordinary
`detach` ops (op_kinds' identity family) and keep them.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from ..errors import GraphsplitError
from ..ir.meta import TensorSpec, info, insert_node
from ..ir.op_kinds import OpKind
from ..ir.param_grads import CALLS, in_place
from .manager import PassInput, PassResults


def grad_mode_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, None]:
    keep_grad_modes(gm)
    return gm, None


def keep_grad_modes(gm: fx.GraphModule) -> int:
    """Detach the inputs of every grad-disabled op that need a gradient; returns how many detaches.

    Reads `NodeInfo.value` and `.tensor.requires_grad` from the meta analysis, which ran
    each op in its own grad mode: a value needs a gradient exactly when it does in the
    untouched model.
    """
    graph = gm.graph
    detached: dict[fx.Node, fx.Node] = {}
    for node in list(graph.nodes):
        ni = info(node)
        if ni.grad_enabled or node.op not in CALLS or _indexes_container(node):
            continue
        if ni.value == "scalar" and not in_place(node):
            continue  # sizes, ints: no gradient to stop
        _refuse_trainable_module(gm, node)
        self_arg = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        for arg in node.all_input_nodes:
            if _container_needs_grad(arg):
                raise _refusal(gm, node, f"takes the container {arg.name}, whose tensors need gradients, whole")
            spec = info(arg).tensor
            if info(arg).value != "tensor" or spec is None or not spec.requires_grad:
                continue
            if arg not in detached:
                detached[arg] = _detach(graph, arg, node)
            node.replace_input_with(arg, detached[arg])
        if self_arg is not None and self_arg in detached and in_place(node):
            # `h.add_(1)` returns h itself: later readers of the result get the original tensor
            # (with its autograd history), the mutation having gone through the shared storage
            node.replace_all_uses_with(self_arg)
    return len(detached)


def _detach(graph: fx.Graph, value: fx.Node, at: fx.Node) -> fx.Node:
    """`value.detach()` just before its first grad-disabled reader `at`."""
    spec = info(value).tensor
    assert spec is not None
    # it belongs to the op it serves, at that op's line of the model
    return insert_node(graph, "detach", (value,), op="call_method", before=at, owner=at, kind=OpKind.OTHER,
                       tensor=TensorSpec(spec.shape, spec.dtype, False), source=info(at).source, grad_enabled=False)


def _indexes_container(node: fx.Node) -> bool:
    """`parts[0]` on a tuple or list: Python indexing, which hands out the element as it is."""
    return (
        node.op == "call_function"
        and node.target is operator.getitem
        and isinstance(node.args[0], fx.Node)
        and info(node.args[0]).value == "container"
    )


def _container_needs_grad(value: fx.Node) -> bool:
    """A container made with grad enabled from values that need a gradient (its tensors do too)."""
    if info(value).value != "container" or not info(value).grad_enabled:
        return False
    if _indexes_container(value):
        return _container_needs_grad(value.args[0])  # type: ignore[arg-type]
    if value.op == "call_module":
        return True
    return any(
        (a.tensor is not None and a.tensor.requires_grad) or _container_needs_grad(n)
        for n in value.all_input_nodes
        for a in (info(n),)
    )


def _refuse_trainable_module(gm: fx.GraphModule, node: fx.Node) -> None:
    """A leaf module's parameters are not graph values: none could be detached. (The tracer
    traces through such modules in grad-disabled code; this is the guard.)"""
    if node.op != "call_module":
        return
    module = gm.get_submodule(str(node.target))
    if any(p.requires_grad for p in module.parameters()):
        raise _refusal(gm, node, f"calls module {node.target} ({type(module).__name__}), whose parameters "
                                 "graphsplit cannot keep from training there")


def _refusal(gm: fx.GraphModule, node: fx.Node, what: str) -> GraphsplitError:
    ni = info(node)
    where = f" at {ni.source}" if ni.source is not None else ""
    module = f" in module '{ni.module}'" if ni.module else ""
    return GraphsplitError(
        f"{type(gm).__name__}: the no_grad/inference_mode code{module}{where} {what}; "
        "move that op out of the region, or freeze the parameters with requires_grad_(False)"
    )
