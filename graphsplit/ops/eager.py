"""Functions that run eagerly under --compile: a graph break, not something dynamo traces into.

    @eager
    def all_reduce(...): ...

A collective's communicator is Python (a process group, or the local backend's threads), and the
compiled pieces between collectives are where the work is. What a stage sends under a zero-bubble
schedule is eager too: inside a compiled graph AOT autograd returns an output that aliases another
as a view of it, which torch's split backward cannot detach in place.

`torch.compiler.disable` imports torch._dynamo (seconds), so each function is disabled when first
called or when stages are compiled (`disable_for_compile`), not when its module is imported by
every command.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_LAZY: list[Any] = []


def eager(fn: Any) -> Any:
    disabled: Any = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    def arm() -> None:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)

    _LAZY.append(arm)
    return call


def disable_for_compile() -> None:
    """Make every eager function a graph break before dynamo first traces a stage (it then finds
    each one already disabled, never the lazy set-up)."""
    for arm in _LAZY:
        arm()
