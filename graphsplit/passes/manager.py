"""Runs passes in order: times each, lints its graph, names the pass that failed, and can
switch a pass off by name. Which passes run, in which order, is the compiler's
(rewrite.py); this module imports none of them.

A pass is a function `(gm, inp, done) -> (gm, result)`: `inp` is the frozen
`PassInput` every pass reads (the plan, one micro-batch of example inputs, a saved
split, the loss), `done` the results of the passes before it, and `result` the
pass's own typed, frozen result, or None.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.batch import BatchDims
from ..plan import Plan

T = TypeVar("T")


@dataclass(frozen=True)
class LossInput:
    """The user's loss, for passes that rewrite it with the model (vocab-parallel cross-entropy)."""

    fn: Callable[[Any, Any], torch.Tensor]
    target: Any  # one micro-batch of it
    out_spec: pytree.TreeSpec  # how the model's output is built from the graph's output leaves
    # the loss couples the samples and runs on the whole batch, the replicas' outputs gathered
    # (runtime/whole_batch.py): its means are the whole batch's as they are
    whole_batch: bool = False


@dataclass(frozen=True)
class PassInput:
    plan: Plan
    example_inputs: tuple[torch.Tensor, ...]  # one micro-batch: the shapes stages see
    # node names where stages start, from a saved plan.json: reproduces a split exactly
    fixed_cuts: tuple[str, ...] | None = None
    loss: LossInput | None = None
    batch: BatchDims | None = None  # where the batch is (the sums that add its samples up: token_mean.py)


@dataclass(frozen=True)
class PassResults:
    """The results passes returned so far, looked up by type."""

    found: tuple[Any, ...] = ()

    def get(self, kind: type[T]) -> T | None:
        return next((r for r in self.found if isinstance(r, kind)), None)

    def adding(self, result: Any) -> PassResults:
        return self if result is None else PassResults((*self.found, result))


Pass = Callable[[fx.GraphModule, PassInput, PassResults], tuple[fx.GraphModule, Any]]


@dataclass(frozen=True)
class PassRun:
    gm: fx.GraphModule
    results: PassResults
    timings: Mapping[str, float]  # seconds per pass that ran


def run_passes(
    gm: fx.GraphModule, inp: PassInput, passes: Sequence[tuple[str, Pass]], disabled: frozenset[str] = frozenset()
) -> PassRun:
    unknown = disabled - {name for name, _ in passes}
    if unknown:
        raise GraphsplitError(f"no pass is called {', '.join(sorted(unknown))}; "
                              f"the passes are {', '.join(name for name, _ in passes)}")
    done: list[str] = []
    results = PassResults()
    timings: dict[str, float] = {}
    for name, fn in passes:
        if name in disabled:
            continue
        start = time.perf_counter()
        before = _nodes(gm)
        try:
            out, result = fn(gm, inp, results)
            # a malformed graph is this pass's failure, not a later one's: checked where the pass added,
            # removed or moved nodes (a lint walks every node: 30 ms an 80-layer model, for each pass);
            # the last pass's graph is checked whatever it did, so a rewiring alone is caught there
            if isinstance(out, fx.GraphModule) and (out is not gm or _nodes(out) != before or name == passes[-1][0]):
                out.graph.lint()
        except GraphsplitError:
            raise
        except Exception as exc:
            after = ", ".join(done) or "no other pass"
            raise GraphsplitError(f"pass {name} failed (after {after}): {type(exc).__name__}: {exc}") from exc
        if not isinstance(out, fx.GraphModule):
            raise GraphsplitError(f"pass {name} returned {type(out).__name__}, not a GraphModule")
        timings[name] = time.perf_counter() - start
        results = results.adding(result)
        done.append(name)
        gm = out
    return PassRun(gm, results, MappingProxyType(timings))


def _nodes(gm: fx.GraphModule) -> tuple[int, ...]:
    """The graph's nodes, in order, by identity: what a pass that adds, removes or moves nodes changes."""
    return tuple(map(id, gm.graph.nodes))
