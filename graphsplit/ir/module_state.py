"""Tracing runs the model's Python, which may write to the model: a cache (`self.src_mask = mask` in
pytorch/examples' word_language_model), a counter, fx's own `_tensor_constant0` for a tensor made
in forward. Written during a trace, such values are proxies or fake tensors, and the next call of
the user's model (the reference run, `parallelize`'s materialization, the export fallback after fx
failed half-way) would read them. The user's model is never edited: `left_as_found` puts every
module's attributes and registries back as they were before the trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch.nn as nn

from ..loader import tensor_attributes

_REGISTRIES = ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks")


@contextlib.contextmanager
def left_as_found(model: nn.Module) -> Iterator[None]:
    """On exit, each module of `model` (as it was on entry) holds the attributes it held on entry.
    Objects it held are the same objects; what the trace mutated inside them is not undone."""
    saved = [(m, dict(vars(m)), {k: dict(vars(m)[k]) for k in _REGISTRIES if k in vars(m)}) for m in model.modules()]
    try:
        yield
    finally:
        for module, attributes, registries in saved:
            state = vars(module)
            for added in [k for k in state if k not in attributes]:
                del state[added]
            state.update(attributes)
            for name, entries in registries.items():
                table = state[name]
                table.clear()
                table.update(entries)


def attributes_as_buffers(model: nn.Module, state: Callable[[str, str], bool] = lambda owner, attr: False) -> list[str]:
    """Register each plain tensor attribute of `model`'s modules as a buffer, for torch.fx to read it as
    a graph value (`self.freqs_cis[input_pos]`, `self.mask[:T, :T]` with a traced index: a plain tensor
    would be indexed by a proxy); their qualified names. Only inside `left_as_found`, which puts them
    back as they were. `state(owner, attr)`: what a module run as written writes in forward (the trace
    reads what each call leaves, eager_modules.py), left as it is."""
    names = []
    for owner, attr in tensor_attributes(model):
        if state(owner, attr):
            continue
        module = model.get_submodule(owner)
        module._buffers[attr] = vars(module).pop(attr)
        names.append(f"{owner}.{attr}" if owner else attr)
    return names
