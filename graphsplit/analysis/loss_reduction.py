"""How a loss reduces over the batch, where that decides whether cutting the batch changes it.

A cross-entropy or NLL with reduction 'mean' divides by the number of tokens it counts (those
whose target is not `ignore_index`). graphsplit computes the loss on each micro-batch and dp
replica and averages those losses as equals, which is the whole batch's mean only when every
piece counts as many tokens: with uneven padding it is not (the gradient-accumulation bug HF
transformers fixed in 2024). Megatron and torchtitan divide each piece's sum by the global count
of counted tokens instead; graphsplit does not do that yet, so it names such losses
(`token_means`) for `run` to say how it combined the pieces.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..ir.meta import info

aten = torch.ops.aten
_MEAN = 1  # ATen's reduction enum: 0 none, 1 mean, 2 sum

# spelling -> (the reduction's position, its keyword, its default)
_FUNCTIONS = {
    F.cross_entropy: (6, "reduction", "mean"),
    F.nll_loss: (6, "reduction", "mean"),
}
_ATEN = {aten.cross_entropy_loss, aten.nll_loss, aten.nll_loss_nd, aten.nll_loss2d}
_MODULES = (nn.CrossEntropyLoss, nn.NLLLoss)


def token_means(gm: fx.GraphModule) -> Iterator[str]:
    """Where `gm` averages a cross-entropy or NLL over the tokens it counts: the model's line (or
    the node's name)."""
    for node in gm.graph.nodes:
        if _is_token_mean(node, gm):
            source = info(node).source
            yield str(source) if source is not None else node.name


def _is_token_mean(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return isinstance(module, _MODULES) and module.reduction == "mean"
    if node.op != "call_function":
        return False
    if node.target in _FUNCTIONS:
        index, key, default = _FUNCTIONS[node.target]
        reduction = node.args[index] if len(node.args) > index else node.kwargs.get(key, default)
        return reduction == "mean"
    if isinstance(node.target, torch._ops.OpOverload) and node.target.overloadpacket in _ATEN:
        reduction = node.args[3] if len(node.args) > 3 else node.kwargs.get("reduction", _MEAN)
        return reduction == _MEAN
    return False
