"""The user's loss_fn as a graph over the model's output leaves and the target, so passes can
rewrite it with the model: token_mean.py (means over counted tokens) and vocab_parallel_loss.py
(cross-entropy over vocab-sharded logits).

`trace_loss(loss_fn, out_spec, output_leaves, n_tensor_leaves)` traces `loss_fn(output, target)`
with torch.fx; its inputs are the output's tensor leaves, then the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from ..ir.devices import explicit_devices
from ..ir.size_conditions import SizeValues
from ..ir.trace_decisions import DecidingTracer
from ..ir.traced_model import fill_leaves


class _Loss(nn.Module):
    """forward(*tensor_leaves, target) = loss_fn(output rebuilt from the leaves, target)."""

    def __init__(self, loss_fn: Callable[[Any, Any], torch.Tensor], spec: pytree.TreeSpec, leaves: list[tuple[str, Any]]):
        super().__init__()
        self.loss_fn = loss_fn
        self.spec = spec
        self.leaves = leaves

    def rebuild(self, tensors: list[Any]) -> Any:
        return pytree.tree_unflatten(fill_leaves(self.leaves, tensors), self.spec)


class _LossTracer(DecidingTracer):
    """A loss_fn calling a module of its own (`criterion = nn.BCEWithLogitsLoss()` at module level,
    open_clip's `ClipLoss()`): no submodule of the loss graph, so traced through, not called as one.
    Given the example values (one micro-batch's), it decides what the model's tracer decides from
    sizes: a loop over a split's chunks (litgpt's chunked cross-entropy) is unrolled, their count
    checked in the graph (ir/trace_decisions.py)."""

    def __init__(self, sizes: SizeValues | None) -> None:
        super().__init__()
        self.sizes = sizes
        self.conditions, self.value_checks, self.state_branches = [], [], []

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not any(m is sub for sub in self.root.modules()):
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)


def trace_loss(loss_fn: Callable[[Any, Any], torch.Tensor], spec: pytree.TreeSpec, leaves: list[tuple[str, Any]],
               n_tensors: int, examples: tuple[Any, ...] | None = None) -> fx.GraphModule:
    """`examples`: the output's tensor leaves and the target, as one micro-batch holds them (on meta)."""
    names = [f"out{i}" for i in range(n_tensors)]
    namespace: dict[str, Any] = {}
    src = f"def forward(self, {', '.join([*names, 'target'])}):\n    return self.loss_fn(self.rebuild([{', '.join(names)}]), target)\n"
    exec(src, namespace)  # noqa: S102 - a fixed signature; fx needs named arguments
    cls = type("LossGraph", (_Loss,), {"forward": namespace["forward"]})
    module = cls(loss_fn, spec, leaves)
    sizes = SizeValues(module, dict(zip([*names, "target"], examples))) if examples is not None else None
    graph = _LossTracer(sizes).trace(module)
    placeholders = list(graph.find_nodes(op="placeholder"))
    if placeholders:  # `torch.arange(n)` in loss_fn: on the device of the output it reads
        explicit_devices(graph, like=placeholders[0])
    return fx.GraphModule(module, graph, class_name="Loss")
