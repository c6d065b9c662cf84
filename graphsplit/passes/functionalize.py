"""Leaf modules -> functional calls on get_attr weights.

`self.fc(x)` (call_module on an nn.Linear) becomes `F.linear(x, fc.weight, fc.bias)`,
so passes rewrite one spelling of a linear, an embedding or a convolution, and can
see (and shard, or cast) its weight as a graph value. Modules with options the
functional form would change (padding modes, max_norm...) stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..ir.meta import TensorSpec, info, replace_node
from ..ir.op_kinds import OpKind

_CONV = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}
# norms over the last dims, which sequence parallelism runs on a shard of the tokens, their
# weights graph values so that their gradients can be summed over the ranks
_NORMS = {nn.LayerNorm: F.layer_norm, nn.RMSNorm: F.rms_norm}
NORM_MODULES = tuple(_NORMS)


def _functional(mod: nn.Module) -> tuple[Callable[..., Any], list[str], dict[str, Any]] | None:
    """(function, tensor attribute names, extra kwargs) for modules with a faithful functional form."""
    bias = ["bias"] if getattr(mod, "bias", None) is not None else []
    if isinstance(mod, nn.Linear):
        return F.linear, ["weight", *bias], {}
    if isinstance(mod, nn.Embedding) and mod.max_norm is None and not mod.sparse and not mod.scale_grad_by_freq:
        return F.embedding, ["weight"], ({"padding_idx": mod.padding_idx} if mod.padding_idx is not None else {})
    if type(mod) in _NORMS:
        names = [n for n in ("weight", "bias") if getattr(mod, n, None) is not None]
        return _NORMS[type(mod)], names, {"eps": mod.eps}
    if type(mod) in _CONV and mod.padding_mode == "zeros":
        kwargs = {"stride": mod.stride, "padding": mod.padding, "dilation": mod.dilation, "groups": mod.groups}
        return _CONV[type(mod)], ["weight", *bias], kwargs
    return None


def functionalize_modules(gm: fx.GraphModule, kinds: tuple[type[nn.Module], ...] = (nn.Linear, nn.Embedding)) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        mod = gm.get_submodule(str(node.target))
        form = _functional(mod) if isinstance(mod, kinds) else None
        if form is None:
            continue
        fn, names, kwargs = form
        with graph.inserting_before(node):
            attrs = []
            for n in names:
                attr = graph.get_attr(f"{node.target}.{n}")
                t = getattr(mod, n)
                ai = info(attr)
                ai.value, ai.kind, ai.module = "tensor", OpKind.PARAM, str(node.target)
                ai.tensor = TensorSpec(tuple(t.shape), t.dtype, t.requires_grad)
                attrs.append(attr)
            if fn in _NORMS.values():
                weight = attrs[0] if mod.weight is not None else None
                bias = attrs[-1] if getattr(mod, "bias", None) is not None else None
                shape = tuple(mod.normalized_shape)
                args = (node.args[0], shape, weight, bias) if fn is F.layer_norm else (node.args[0], shape, weight)
            elif fn is F.linear or fn in _CONV.values():
                args = (node.args[0], *attrs) if len(attrs) == 2 else (node.args[0], attrs[0], None)
            else:
                args = (node.args[0], *attrs)
        replace_node(node, fn, args, kwargs)
