"""Plain pointwise ops on meta tensors without torch's Python meta kernels, for the analyses' runs.

torch registers the Meta kernels of many pointwise ops in Python (torch/_meta_registrations.py: the
refs, behind their type-promotion wrappers), about 100 us a call where a C++ kernel takes a few; the
analyses of an 80-layer model make thousands of such calls in each run over the graph. Where the
answer is plain (every tensor input a contiguous meta tensor of one floating dtype, an op whose output
keeps that dtype, no `out=`) the output is made directly: an empty contiguous meta tensor of the
broadcast shape, which is what the kernel makes for such inputs. Anything else runs the op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# pointwise ops whose output, for floating inputs of one dtype and Python-number scalars, has that dtype
KEEP_FLOAT = frozenset({
    aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar,
    aten.div.Tensor, aten.div.Scalar, aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.rsqrt.default,
    aten.sqrt.default, aten.reciprocal.default, aten.neg.default, aten.exp.default, aten.silu.default,
    aten.sigmoid.default, aten.tanh.default, aten.relu.default, aten.gelu.default,
})


class FastMetaPointwise(TorchDispatchMode):
    """`with FastMetaPointwise():` plain pointwise ops on meta tensors are answered at once. Enter it
    below the modes that must see every op (the batch discovery, the FLOP counter): they call the op,
    and this mode answers that call."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in KEEP_FLOAT:
            out = plain_output(args, kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def plain_output(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The output of a KEEP_FLOAT op on `args`, where it is plain; None where the op must run."""
    if "out" in kwargs:
        return None
    shapes = []
    dtype = None
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.device.type != "meta" or not a.dtype.is_floating_point or (dtype is not None and a.dtype != dtype) \
                    or not a.is_contiguous() or not all(type(s) is int for s in a.shape):
                return None
            dtype = a.dtype
            shapes.append(tuple(a.shape))
        elif not isinstance(a, (int, float, bool, str)) and a is not None:
            return None
    if dtype is None:
        return None
    try:
        shape = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return None  # the op says why
    return torch.empty(shape, dtype=dtype, device="meta")
