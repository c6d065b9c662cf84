"""A forward that takes *args/**kwargs, called with named inputs only (`forward(self, input_ids, ...,
**kwargs)`, as HF-style models write it): torch.fx makes a placeholder of each parameter its code names,
so it traces a stand-in with the named parameters alone that calls forward with the rest empty."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch.nn as nn


def takes_var_args(model: nn.Module) -> bool:
    return any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in inspect.signature(model.forward).parameters.values())


def named_only(forward: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    """`forward` (a class's, self first) as a function of its named parameters alone, calling it with
    its *args/**kwargs empty: fx makes a placeholder of each parameter its code object names."""
    params = ", ".join(names)
    code = f"def forward(self, {params}):\n    return _forward(self, {', '.join(f'{n}={n}' for n in names)})\n"
    scope: dict[str, Any] = {"_forward": forward}
    exec(compile(code, f"<{forward.__qualname__} without *args/**kwargs>", "exec"), scope)  # noqa: S102
    return scope["forward"]
