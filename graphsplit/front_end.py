"""The compiler's front end, one for the program and the planner: what the model is before any plan.

    front_end(model, args, ...) -> Front(traced, flat, batch, retraced, timings)

1. the example inputs checked against `forward`'s signature (`check_call`);
2. the model traced (torch.fx, else torch.export: ir/trace.py), or a trace given;
3. the batch found in the graph (`find_batch`: analysis/batch/), or the model file's batch_dims();
4. where torch.export fixed the batch's real dim (a seq-first model's 1), traced again with it symbolic
   (`export_batch_dims`), and the batch found again where it names graph nodes;

`rewrite_program` builds the program from a Front; the planner's profile (planner/profile.py) prices
the same graph, so prices and program cannot drift apart in what they start from. What depends on a
plan (the micro-batch cut and what it implies: embedding bags reading their piece's offsets, the
gathers before a whole-batch tail; context parallelism's sequence) is the compiler's, after this.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .analysis.batch import find_batch_dims
from .errors import GraphsplitError
from .ir.batch import BatchDims
from .ir.trace import trace_model
from .ir.traced_model import Traced


@dataclass
class Front:
    traced: Traced
    flat: tuple[Any, ...]  # the example inputs, flat, as the graph takes them
    batch: BatchDims
    retraced: bool  # traced again with the batch's dims symbolic (step 4)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: "trace", "batch"


def front_end(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    source: Path | None = None,
    loss_fn: Any = None,
    target: Any = None,
    declared: dict[str, int | None] | None = None,
    buffers: Callable[[], Mapping[str, torch.Tensor]] | None = None,
    traced: Traced | None = None,
    sequence: bool = False,
    first_trace: Callable[[], Traced] | None = None,
) -> Front:
    """Steps 1-4 of the module docstring. `traced`: a trace of this model with these inputs, used as it
    is (pass a copy to keep yours); `first_trace`: how to trace it the first time (the planner traces
    alike blocks as calls, to fold them); `sequence`: context parallelism's sequence symbolic too."""
    check_call(model, args, kwargs, source)
    start = time.perf_counter()
    if traced is None:
        traced = first_trace() if first_trace is not None else trace_model(model, args, kwargs, source,
                                                                           buffers=buffers)
    timings = {"trace": time.perf_counter() - start}
    start = time.perf_counter()
    flat = traced.flatten_inputs(args, kwargs)
    batch = find_batch(traced, flat, loss_fn, target, declared)
    symbolic = export_batch_dims(traced, flat, batch, sequence)
    if symbolic is not None:
        traced = trace_model(model, args, kwargs, source, batch_dims=symbolic, buffers=buffers)
        flat = traced.flatten_inputs(args, kwargs)
        if batch.gather or batch.bags or batch.sums:  # the nodes named are the graph's they were found in
            batch = find_batch(traced, flat, loss_fn, target, declared)
    timings["batch"] = time.perf_counter() - start
    return Front(traced, flat, batch, symbolic is not None, timings)




def check_call(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], source: Path | None = None) -> None:
    """The example inputs must be a call `forward` accepts: a wrong keyword name is said here,
    in the model's terms, not later as a tracing failure."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to compare against
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        names = list(signature.parameters)
        takes = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        given = ", ".join([*(f"<positional {i}>" for i in range(len(args))), *kwargs])
        where = f" in {source}" if source is not None else ""
        raise GraphsplitError(
            f"example_inputs(){where} does not fit {type(model).__name__}.forward({takes}): {exc} "
            f"(given: {given or 'nothing'}); return the inputs forward takes: a tuple in order, or a dict by name"
        ) from exc



def find_batch(traced: Traced, flat: tuple[Any, ...], loss_fn: Any, target: Any,
               declared: dict[str, int | None] | None = None) -> BatchDims:
    """Where each input, the target and each output hold the batch (analysis/batch/)."""
    loss = None
    if loss_fn is not None:
        def loss(raw: Any, meta_target: Any) -> Any:
            return loss_fn(traced.unflatten_output(raw), meta_target)

    def leaves(raw: Any) -> list[Any]:
        return list(raw) if isinstance(raw, tuple | list) else [raw]

    return find_batch_dims(traced.gm, traced.input_names, flat, leaves, loss, target, declared)


def export_batch_dims(traced: Traced, flat: tuple[Any, ...], batch: BatchDims,
                      sequence: bool = False) -> dict[int, Any] | None:
    """The batch dims (by input tensor id) to trace again with, when torch.export left dim 0 symbolic
    and fixed the batch's real dim (a seq-first model's 1); None: this trace runs on micro-batches.
    `sequence` (context parallelism): the sequence's dims symbolic too (export fixes every other size,
    and each cp rank runs the graph on its shard of the sequence)."""
    dims = batch.input_dims(traced.input_names)
    if traced.tracer != "export":
        return None
    if sequence and batch.sequence is not None:
        seq = batch.sequence.input_dims(traced.input_names)
        return {id(t): (d, s) for t, d, s in zip(flat, dims, seq)}
    if all(d in (0, None) for d in dims):
        return None
    return {id(t): d for t, d in zip(flat, dims)}
