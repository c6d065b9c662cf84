"""The planner's independent pieces of work (one tp degree's tables, one group of candidates) on the
machine's cores: forked processes read the profile copy-on-write (a traced graph and its tables are
not worth pickling) and send their results back. One core, or no fork: the same calls in turn."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_STATE: Any = None  # what the forked workers read: set before the pool forks them


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _call(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_STATE, item)


def fork_map(fn: Callable[[Any, Item], Result], state: Any, items: Iterable[Item]) -> list[Result]:
    """`[fn(state, item) for item in items]`, spread over forked processes where cores are spare.
    `fn` must be a module-level function (it is sent by name); its results must pickle."""
    items = list(items)
    workers = min(len(items), usable_cores())
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(state, item) for item in items]
    global _STATE
    _STATE = state
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_call, [fn] * len(items), items))
    finally:
        _STATE = None
