"""What an op sums without normalizing, and values made from sizes alone, in every spelling.

A loss summed over the samples (`loss.sum()`, `F.mse_loss(..., reduction='sum')`, a VAE's
`-0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp())`) is the sum of its pieces' losses, where a
mean is their average: the program must add the micro-batches' and replicas' losses, not average
them (analysis/batch/sums.py finds which sums reduce the batch, passes/token_mean.py scales them).
A sum divided by a size read from the data (`x.sum() / x.size(0)`) is a mean of the piece it runs on.
"""

from __future__ import annotations

import inspect

import torch
import torch.fx as fx
import torch.nn as nn

from .op_kinds import OpKind, family, op_name

_SUMS = frozenset({"sum", "nansum"})
_SUM = 2  # ATen's reduction enum: 0 none, 1 mean, 2 sum


def summed_value(node: fx.Node, gm: fx.GraphModule) -> fx.Node | None:
    """The value `node` sums, unnormalized (None: it does not): `x.sum()`, `torch.nansum(x)`, a loss with
    reduction 'sum' as a function (`F.l1_loss(..., reduction='sum')`), a module (`nn.MSELoss(reduction=
    'sum')`) or ATen (`aten.nll_loss_forward(..., 2, ...)`): its first argument, the per-element values."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        summed = isinstance(module, nn.modules.loss._Loss) and module.reduction == "sum"
        return _first(node) if summed else None
    if node.op not in ("call_function", "call_method"):
        return None
    name = op_name(node)
    if name in _SUMS:
        return _first(node)
    if name.endswith("_loss") or name in ("cross_entropy", "kl_div", "binary_cross_entropy",
                                           "binary_cross_entropy_with_logits"):
        return _first(node) if _reduction(node) in ("sum", _SUM) else None
    return None


def from_sizes(node: object) -> bool:
    """`node` is computed from tensors' sizes (`x.size(0)`, `x.shape[0] * x.shape[1]`, `x.numel()`,
    ATen's sym_size) and constants alone, reading no tensor's values."""
    if not isinstance(node, fx.Node):
        return False
    stack, seen, sized = [node], {node}, False
    while stack:
        n = stack.pop()
        if _size_query(n):
            sized = True
            continue
        if n.op in ("placeholder", "get_attr", "call_module"):
            return False
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return sized


def _size_query(node: fx.Node) -> bool:
    """`x.size(0)`, `x.shape`, `x.numel()`, ATen's sym_size, in any spelling (op_kinds' SHAPE family)."""
    return node.op in ("call_function", "call_method") and family(node, node.graph.owning_module) == OpKind.SHAPE


def _first(node: fx.Node) -> fx.Node | None:
    first = node.args[0] if node.args else next(iter(node.kwargs.values()), None)
    return first if isinstance(first, fx.Node) else None


def _reduction(node: fx.Node) -> object:
    """The reduction a loss call asks for ('mean', 'sum', 'none' or ATen's 0 / 1 / 2); None where legacy
    size_average / reduce decide it or the call cannot be read."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        names = [a.name for a in target._schema.arguments]
        if "reduction" not in names:
            return None
        k = names.index("reduction")
        default = target._schema.arguments[k].default_value
        return node.args[k] if len(node.args) > k else node.kwargs.get("reduction", default)
    if node.op == "call_method" or not callable(target):
        return node.kwargs.get("reduction")
    try:
        bound = inspect.signature(target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):
        return None
    given = bound.arguments
    if given.get("size_average") is not None or given.get("reduce") is not None:
        return None
    if "reduction" in given:
        return given["reduction"]
    parameter = inspect.signature(target).parameters.get("reduction")
    return parameter.default if parameter is not None else None
