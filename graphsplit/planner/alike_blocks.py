"""Blocks alike in everything tracing can see: the planner traces two and lets the second stand in.

A deep model's repeated blocks cost most of the planner's trace (Llama 3 405B: 126 blocks, 8,000
nodes), and its fold (fold.py) keeps two of them. `alike_blocks` finds the longest container of
MIN_BLOCKS or more blocks in which every block from the third on equals the second in all that
decides what tracing its forward records: each module's class, every attribute that is not a
parameter, buffer or submodule (values compared; other objects by identity, so a config all blocks
share matches and an object per block does not), every parameter's and buffer's shape, dtype and
requires_grad, recursively, and no forward or backward hook. Those blocks are traced as one call
each; fold.py checks how each is called and stands the second block's ops in for it. Anything else
(a layer index kept in an attribute, as HF's `layer_idx`, a hook, a per-block object) and the model
is traced whole, as the compiler traces it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .fold import MIN_BLOCKS

_PRIMITIVE = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)
_STRUCTURE = frozenset({"_parameters", "_buffers", "_modules"})


def _value(v: Any) -> Any:
    if isinstance(v, _PRIMITIVE):
        return (type(v), v)
    if isinstance(v, (tuple, list, frozenset, set)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return (type(v), tuple(_value(x) for x in items))
    if isinstance(v, dict):
        return (dict, tuple((_value(k), _value(x)) for k, x in v.items()))
    return ("object", id(v))


def fingerprint(m: nn.Module) -> Any:
    """What tracing `m`'s forward can depend on, or None when a hook could run code of its own."""
    attributes = []
    for k, v in vars(m).items():
        if k in _STRUCTURE:
            continue
        if k.startswith(("_forward", "_backward")) and isinstance(v, dict):
            if v:
                return None  # a hook
            continue
        if "hook" in k and isinstance(v, dict):
            continue  # state_dict hooks: not called by forward
        attributes.append((k, _value(v)))
    params = tuple((n, None if p is None else (tuple(p.shape), p.dtype, p.requires_grad))
                   for n, p in m._parameters.items())
    buffers = tuple((n, None if b is None else (tuple(b.shape), b.dtype)) for n, b in m._buffers.items())
    children = []
    for n, c in m._modules.items():
        inner = None if c is None else fingerprint(c)
        if c is not None and inner is None:
            return None
        children.append((n, inner))
    return (type(m), tuple(attributes), params, buffers, tuple(children))


def _global_hooks() -> bool:
    module = torch.nn.modules.module
    return any(getattr(module, name, None) for name in dir(module) if name.startswith("_global_") and "hook" in name)


def alike_blocks(model: nn.Module) -> tuple[list[str], frozenset[str]]:
    """(every block of the longest run of repeated blocks, the blocks from the third on when each of them
    is alike the second, else none)."""
    best: list[str] = []
    for name, container in model.named_modules():
        kids = list(container._modules)
        if len(kids) >= max(MIN_BLOCKS, len(best) + 1) and kids == [str(i) for i in range(len(kids))]:
            best = [f"{name}.{k}" if name else k for k in kids]
    if not best or _global_hooks():
        return best, frozenset()
    second = fingerprint(model.get_submodule(best[1]))
    if second is None or any(fingerprint(model.get_submodule(b)) != second for b in best[2:]):
        return best, frozenset()
    return best, frozenset(best[2:])
