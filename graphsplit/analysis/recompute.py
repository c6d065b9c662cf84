"""Which values a stage can compute for itself instead of receiving them.

Scalars (sizes, ints) always can. So can tensors computed only from
parameters, buffers and scalars (a RoPE table sliced to the sequence length,
a causal mask, a transposed weight): every stage that needs one recomputes it
from its own copy of the buffer, so it never crosses a pipeline boundary. Not a
value some op writes in place (ir/aliasing.py): it is computed once, and sent.
"""

from __future__ import annotations

import torch.fx as fx

from ..ir.aliasing import Storages
from ..ir.meta import info
from ..ir.param_grads import mutates

_RANDOM = ("rand", "dropout", "bernoulli", "multinomial", "normal")


def recomputable(graph: fx.Graph, storages: Storages | None = None) -> set[fx.Node]:
    """The nodes a stage can compute for itself instead of receiving (`storages`: the graph's, where
    the caller already has them; they cost a pass over every node's schema)."""
    if storages is None and graph.owning_module is not None:
        storages = Storages(graph.owning_module)
    found: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            found.add(node)
            continue
        if node.op in ("placeholder", "output"):
            continue
        ni = info(node)
        if ni.value == "scalar":
            found.add(node)
            continue
        if ni.value != "tensor" or node.op == "call_module":
            continue
        name = str(getattr(node.target, "__name__", node.target)).lower()
        if any(r in name for r in _RANDOM) or mutates(node, name):
            continue
        if storages is not None and storages.is_written(node):  # written in place: computed once, where written
            continue
        if node.all_input_nodes and all(a in found for a in node.all_input_nodes):
            found.add(node)
    return found


def from_weights_alone(graph: fx.Graph) -> set[fx.Node]:
    """Tensors computed from trainable weights and no input tensor (only sizes of inputs) that a
    stage cannot recompute (a module's call, such as a position embedding of `arange`). Sent to a
    later stage, such a value's gradient reaches its weights only through the send: torch's split
    backward (zero-bubble schedules) computes weight gradients from the stage inputs' graph and
    never follows it."""
    gm = graph.owning_module
    trainable = {name for name, p in gm.named_parameters() if p.requires_grad} if gm is not None else set()
    weighted: set[fx.Node] = set()  # computed from trainable weights
    from_input: set[fx.Node] = set()
    found: set[fx.Node] = set()
    recomp = recomputable(graph)
    for node in graph.nodes:
        if node.op == "output":
            continue
        value = info(node).value
        if node.op == "placeholder":
            if value == "tensor":
                from_input.add(node)
            continue
        if node.op == "get_attr":
            if str(node.target) in trainable:
                weighted.add(node)
            continue
        if value == "scalar":
            continue
        if any(a in from_input for a in node.all_input_nodes):
            from_input.add(node)
            continue
        if any(a in weighted for a in node.all_input_nodes) or (node.op == "call_module" and gm is not None and any(
                p.requires_grad for p in gm.get_submodule(str(node.target)).parameters())):
            weighted.add(node)
            if node not in recomp:
                found.add(node)
    return found
