"""Whether a user's autograd Function, kept whole, computes elementwise: then a shard flows through it."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ...ir.autograd_functions import FunctionCall
from ...ir.meta import info

# ATen ops that make or move a value without mixing its elements: with the pointwise-tagged ops, all a
# Function whose forward and backward run nothing else (on tensors of one shape) computes is elementwise
_ELEMENTWISE_PLUMBING = frozenset({"detach", "alias", "_to_copy", "clone", "copy_", "lift_fresh", "empty_like",
                                   "zeros_like", "ones_like", "full_like", "view", "_unsafe_view", "expand"})


def runs_elementwise(call: FunctionCall, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the Function `call` runs, given these arguments (meta stand-ins of its tensors, each
    requiring a gradient where it has one), only elementwise ATen ops, forward and backward, on tensors
    of one shape (0-d scalars aside): then its output's element i is a function of its inputs' elements i
    alone, and any cut of the tensors along any dim commutes with it, its gradient too (BLOOM's
    GeLUFunction, a straight-through rounding, a gradient reversal). Anything else, or a Function that
    cannot run on meta, is not."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes: set[tuple[int, ...]] = set()
    mixes = [False]

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            out = func(*a, **(k or {}))
            if torch.Tag.pointwise not in func.tags and func.overloadpacket.__name__ not in _ELEMENTWISE_PLUMBING:
                mixes[0] = True
            shapes.update(tuple(t.shape) for t in pytree.tree_leaves((a, k, out))
                          if isinstance(t, torch.Tensor) and t.dim() > 0)
            return out

    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    try:
        with Seen():
            outs = [t for t in pytree.tree_leaves(call(*args, **kwargs)) if isinstance(t, torch.Tensor)]
            grads = [o for o in outs if o.requires_grad]
            if grads and inputs:
                torch.autograd.grad(grads, inputs, [torch.empty_like(o) for o in grads], allow_unused=True)
    except Exception:  # noqa: BLE001 -- a Function that cannot run on meta is not known to be elementwise
        return False
    return bool(outs) and not mixes[0] and len(shapes) == 1


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
