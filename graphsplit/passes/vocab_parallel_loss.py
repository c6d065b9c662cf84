"""The user's loss as a graph, so tensor parallelism can rewrite it too.

`trace_loss(loss_fn, out_spec, output_leaves, n_tensor_leaves)` traces
`loss_fn(output, target)` with torch.fx, taking the model output's tensor
leaves and the target as inputs. With tp, `vocab_parallel_loss_pass` then
keeps the LM head's logits sharded over the vocabulary when the loss is a
cross-entropy it can compute in that layout (`ops/tp.vocab_parallel_cross_entropy`),
and drops the gather of the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from ..analysis.shapes import annotate
from ..ir.meta import info
from ..ir.sharding import S
from ..ops import tp as tpops
from .manager import PassContext
from .tensor_parallel import parallelize_loss


class _Loss(nn.Module):
    """forward(*tensor_leaves, target) = loss_fn(output rebuilt from the leaves, target)."""

    def __init__(self, loss_fn: Callable[[Any, Any], torch.Tensor], spec: pytree.TreeSpec, leaves: list[tuple[str, Any]]):
        super().__init__()
        self.loss_fn = loss_fn
        self.spec = spec
        self.leaves = leaves

    def rebuild(self, tensors: list[Any]) -> Any:
        return pytree.tree_unflatten([tensors[v] if kind == "tensor" else v for kind, v in self.leaves], self.spec)


def trace_loss(loss_fn: Callable[[Any, Any], torch.Tensor], spec: pytree.TreeSpec, leaves: list[tuple[str, Any]], n_tensors: int) -> fx.GraphModule:
    names = [f"out{i}" for i in range(n_tensors)]
    namespace: dict[str, Any] = {}
    src = f"def forward(self, {', '.join([*names, 'target'])}):\n    return self.loss_fn(self.rebuild([{', '.join(names)}]), target)\n"
    exec(src, namespace)  # noqa: S102 - a fixed signature; fx needs named arguments
    cls = type("LossGraph", (_Loss,), {"forward": namespace["forward"]})
    module = cls(loss_fn, spec, leaves)
    graph = fx.Tracer().trace(module)
    return fx.GraphModule(module, graph, class_name="Loss")


def vocab_parallel_loss_pass(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    """Keep vocab-sharded logits sharded into a cross-entropy loss (tp > 1 only)."""
    if ctx.plan.tp == 1 or ctx.loss_fn is None or ctx.target is None or ctx.out_spec is None:
        return gm
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves = list(output.args[0])
    tensor_leaves: list[fx.Node] = []
    kinds: list[tuple[str, Any]] = []
    for leaf in leaves:
        if isinstance(leaf, fx.Node):
            if leaf not in tensor_leaves:
                tensor_leaves.append(leaf)
            kinds.append(("tensor", tensor_leaves.index(leaf)))
        else:
            kinds.append(("const", leaf))
    # the leaves tensor_parallel gathered along their last dim (an LM head's logits)
    candidates = {
        i: leaf for i, leaf in enumerate(tensor_leaves)
        if leaf.op == "call_function" and leaf.target is tpops.gather_from_tp
        and leaf.args[1] == len(info(leaf).tensor.shape) - 1
    }
    if not candidates:
        return gm
    try:
        loss_gm = trace_loss(ctx.loss_fn, ctx.out_spec, kinds, len(tensor_leaves))
    except Exception:  # an untraceable loss keeps the gathered logits: correct, just slower
        return gm
    examples = [torch.empty(tuple(info(t).tensor.shape), dtype=info(t).tensor.dtype, device="meta") for t in tensor_leaves]
    target = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), ctx.target)
    annotate(loss_gm, (*examples, target))
    if not parallelize_loss(loss_gm, ctx.plan.tp, {i: S(len(info(leaf).tensor.shape) - 1) for i, leaf in candidates.items()}):
        return gm
    for i, gather in candidates.items():
        sharded = gather.args[0]
        output.args = (tuple(sharded if leaf is gather else leaf for leaf in output.args[0]),)
        gm.graph.erase_node(gather)
        ctx.sharded_outputs[i] = S(len(info(sharded).tensor.shape) - 1)
    gm.recompile()
    ctx.loss_gm = loss_gm
    return gm

