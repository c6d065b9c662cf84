"""The planner's independent pieces of work (one tp degree's tables, one group of candidates) on the
machine's cores: forked processes read the profile copy-on-write (a traced graph is not worth
pickling) and send their results back. One core, or no fork: the same calls in turn, in this process.

`fork_map` runs one batch of calls; `Workers` keeps the processes for a sequence of batches that
depend on each other's results (plan_model: pricing a tp degree's candidates starts as soon as that
degree's tables are built, while the next degree's are still being built)."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

import torch

Item = TypeVar("Item")
Result = TypeVar("Result")

_STATE: Any = None  # what the forked workers read: set before the pool forks them


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _call(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_STATE, item)


def _can_fork(tasks: int) -> bool:
    return min(tasks, usable_cores()) >= 2 and "fork" in multiprocessing.get_all_start_methods()


def fork_map(fn: Callable[[Any, Item], Result], state: Any, items: Iterable[Item]) -> list[Result]:
    """`[fn(state, item) for item in items]`, spread over forked processes where cores are spare.
    `fn` must be a module-level function (it is sent by name); its results must pickle."""
    items = list(items)
    if not _can_fork(len(items)):
        return [fn(state, item) for item in items]
    with Workers(state, len(items)) as workers:
        return [f.result() for f in [workers.submit(fn, item) for item in items]]


class Workers:
    """Forked processes that see `state` as it was when they were made, for up to `tasks` calls at once
    (`with Workers(state, tasks) as w: w.submit(fn, item)` -> a Future of `fn(state, item)`). On one
    core the call runs at submit, here."""

    def __init__(self, state: Any, tasks: int) -> None:
        self.state = state
        self.pool: ProcessPoolExecutor | None = None
        if _can_fork(tasks):
            global _STATE
            _STATE = state
            # the objects alive now (a deep model's modules and graph: millions) are moved out of the
            # collector's sight: a collection in a child would otherwise walk them all, and touching
            # them copies every page the child shares with this process
            gc.freeze()
            # a child forked after this process ran a parallel CPU op (a torch module run on CPU zeros
            # for its shapes) deadlocks in its first OpenMP region: the children run torch on one
            # thread each (they are one per core anyway)
            self.pool = ProcessPoolExecutor(min(tasks, usable_cores()), mp_context=multiprocessing.get_context("fork"),
                                            initializer=torch.set_num_threads, initargs=(1,))
            self.pool.submit(int)  # a fork pool starts all its processes at the first submit: now

    def submit(self, fn: Callable[[Any, Item], Result], item: Item) -> Future[Result]:
        if self.pool is not None:
            return self.pool.submit(_call, fn, item)
        done: Future[Result] = Future()
        try:
            done.set_result(fn(self.state, item))
        except BaseException as exc:  # noqa: BLE001 - raised where the result is read, as a pool's would be
            done.set_exception(exc)
        return done

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        global _STATE
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            _STATE = None
            gc.unfreeze()
