"""A module that reads its inputs' values cannot run on meta tensors: torch's own (nn.TransformerEncoder
looks whether its mask is causal with `bool((mask == causal).all())`), or a module of the model's kept
whole because its forward branches on the data (trace.run_as_written: `if mask.any():` in a hand-written
mixture of experts, a one-hot sized by a maximum). Its output's shapes do not depend on the values: the
analyses run it once on CPU stand-ins of the same shapes instead, if that is small, and read the shapes
back as meta tensors. The stand-ins are seeded draws for floating inputs and weights (a router's top-k of
zeros ties, and one expert would take every token), zeros for integer inputs (valid indices) and for
buffers (masks, tables). `relabel(stand_in, stands_for)` lets a caller carry what it knows of a tensor
(the batch discovery's dim labels) to the tensor that stands for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

# stand-ins of more than this (parameters, buffers and inputs together) are not made
CPU_LIMIT = 1 << 28

# what torch says where an op needs values a meta tensor has not got
_NEEDS_VALUES = ("on meta tensors", "out of meta tensor", "data-dependent", "data dependent", "DynamicOutputShape")


def needs_values(exc: BaseException) -> bool:
    """Whether `exc`, raised running a module on meta tensors, says the module reads values."""
    text = f"{type(exc).__name__}: {exc}"
    return any(s in text for s in _NEEDS_VALUES)


def nbytes(module: torch.nn.Module, args: Any, kwargs: Any) -> int:
    tensors = [*module.parameters(), *module.buffers(), *pytree.tree_leaves((args, kwargs))]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def runs_on_cpu(module: torch.nn.Module, args: Any, kwargs: Any, exc: BaseException) -> bool:
    """Whether a module that failed on meta with `exc` is run on CPU stand-ins instead."""
    return needs_values(exc) and nbytes(module, args, kwargs) <= CPU_LIMIT


def on_cpu_stand_ins(module: torch.nn.Module, args: Any, kwargs: Any,
                 relabel: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> Any:
    """`module(*args, **kwargs)` on CPU stand-ins of the same shapes and dtypes (its parameters and
    buffers too); its output as meta tensors."""

    draws = torch.Generator().manual_seed(0)

    def stand_in(t: torch.Tensor, scale: float = 0.0) -> torch.Tensor:
        if scale and t.is_floating_point():  # values that route as data does (a router's top-k of zeros ties)
            z = torch.randn(t.shape, generator=draws).to(t.dtype) * scale
        else:
            z = torch.zeros(t.shape, dtype=t.dtype)
        z = z.requires_grad_() if t.requires_grad and t.is_floating_point() else z
        if relabel is not None:
            relabel(z, t)
        return z

    held = [(m, dict(vars(m))) for m in module.modules()]
    with torch.device("cpu"):  # its own factory calls beside its stand-ins, not on meta
        state = {name: stand_in(t, 0.1) for name, t in module.named_parameters()}
        state |= {name: stand_in(t) for name, t in module.named_buffers()}  # masks, tables: zeros, not noise
        cpu_args, cpu_kwargs = pytree.tree_map_only(torch.Tensor, lambda t: stand_in(t, 1.0), (args, kwargs))
        out = torch.func.functional_call(module, state, cpu_args, cpu_kwargs)

    def to_meta(t: torch.Tensor) -> torch.Tensor:
        m = torch.empty(t.shape, dtype=t.dtype, device="meta")
        m = m.requires_grad_() if t.requires_grad else m
        if relabel is not None:
            relabel(m, t)
        return m

    # what forward wrote to the modules (`self.aux_loss = ...`) is put back as it was, and kept for
    # eager_modules.written_attribute to read by this call's output: the analyses leave no tensor in the model
    wrote = {}
    for m, before in held:
        for name, value in list(vars(m).items()):
            if isinstance(value, torch.Tensor) and before.get(name) is not value:
                wrote[id(m), name] = to_meta(value)
        vars(m).clear()
        vars(m).update(before)
    result = pytree.tree_map_only(torch.Tensor, to_meta, out)
    first = next((t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)), None)
    if wrote and first is not None:
        key = id(first)
        _WROTE[key] = (weakref.ref(first, lambda _: _WROTE.pop(key, None)), wrote)
    return result


# an output of `on_cpu_stand_ins` -> what the call wrote to its modules: (id of the module, attribute) -> value
# (keyed by id: a tensor's `==` is elementwise; the entry goes with the tensor)
_WROTE: dict[int, tuple[weakref.ref[torch.Tensor], dict[tuple[int, str], torch.Tensor]]] = {}


def wrote_on_cpu(out: Any, module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """What the run on stand-ins whose output is `out` wrote to `module.name` (None: no such run)."""
    first = next((t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)), None)
    held = _WROTE.get(id(first)) if first is not None else None
    if held is None or held[0]() is not first:
        return None
    return held[1].get((id(module), name))
