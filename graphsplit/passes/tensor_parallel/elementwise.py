"""Whether a user's autograd Function, kept whole, computes elementwise: then a shard flows through it."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ...ir.autograd_functions import FunctionCall, runs_elementwise
from ...ir.meta import info

_ELEMENTWISE: dict[Any, bool] = {}


def elementwise_call(node: fx.Node) -> bool:
    """`runs_elementwise` for the call `node` makes, on meta stand-ins of its tensors (once per Function
    and shapes)."""
    def stand_in(a: Any) -> Any:
        spec = info(a).tensor if isinstance(a, fx.Node) else None
        if spec is None:
            return a
        grad = spec.requires_grad and spec.dtype.is_floating_point
        return torch.empty(tuple(spec.shape), dtype=spec.dtype, device="meta", requires_grad=grad)

    args = tuple(stand_in(a) for a in node.args)
    kwargs = {k: stand_in(v) for k, v in node.kwargs.items()}
    key = (node.target, tuple((tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else repr(a)
                              for a in (*args, *kwargs.values())), tuple(kwargs))
    if key not in _ELEMENTWISE:
        target = node.target
        _ELEMENTWISE[key] = isinstance(target, FunctionCall) and runs_elementwise(target, args, kwargs)
    return _ELEMENTWISE[key]
