"""Model + inputs + Plan -> Program: trace, analyze, run the passes, cut."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .analysis.shapes import annotate
from .errors import GraphsplitError
from .passes.manager import PassContext, run_passes
from .plan import Plan
from .program import Program, build_program
from .runtime import split_microbatches
from .trace import trace_model


def require_supported(plan: Plan) -> None:
    """Refuse, clearly, plans that cannot run."""
    if plan.fsdp and plan.dp < 2:
        raise GraphsplitError(f"--fsdp shards parameters over the data-parallel replicas but dp={plan.dp}; "
                              "give --dp 2 or more")
    if plan.sync_bn and plan.dp < 2:
        raise GraphsplitError(f"--sync-bn shares BatchNorm statistics across data-parallel replicas but dp={plan.dp}; "
                              "give --dp 2 or more")


@dataclass
class CompileResult:
    program: Program
    timings: dict[str, float]


def compile_program(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    plan: Plan,
    source: Path | None = None,
    fixed_cuts: tuple[str, ...] | None = None,
    loss_fn: Any = None,
    target: Any = None,
    global_batch: bool = True,
) -> CompileResult:
    """Trace `model`, analyze it at the micro-batch shape, split it: the whole transform.

    `args` hold the global batch (each of the plan's dp replicas takes 1/dp of it), or with
    `global_batch=False` one replica's batch (parallelize() inside a rank).
    """
    require_supported(plan)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    traced = trace_model(model, args, kwargs, source)
    timings["trace"] = time.perf_counter() - start
    flat = traced.flatten_inputs(args, kwargs)
    # Stages see micro-batches: analyze (shapes, bytes, FLOPs) at that size.
    pieces = plan.num_microbatches * (plan.dp if global_batch else 1)
    micro = split_microbatches(flat, pieces)[0]
    start = time.perf_counter()
    annotate(traced.gm, tuple(torch.as_tensor(t) for t in micro))
    timings["analyze"] = time.perf_counter() - start
    micro_target = split_microbatches(target, pieces)[0] if target is not None else None
    ctx = PassContext(plan=plan, inputs=tuple(micro), fixed_cuts=fixed_cuts, loss_fn=loss_fn,
                      target=micro_target, out_spec=traced.out_spec)
    run_passes(traced.gm, ctx)
    timings.update({f"pass:{k}": v for k, v in ctx.timings.items()})
    start = time.perf_counter()
    program = build_program(traced, plan, ctx.param_shardings, ctx.replicated)
    program.loss_gm, program.sharded_outputs = ctx.loss_gm, dict(ctx.sharded_outputs)
    timings["build"] = time.perf_counter() - start
    return CompileResult(program, timings)


def compile_loaded(loaded: Any, plan: Plan, fixed_cuts: tuple[str, ...] | None = None) -> CompileResult:
    """`compile_program` for a loaded model file: built on meta, with its loss and target."""
    return compile_program(
        loaded.build("meta"), loaded.args, loaded.kwargs, plan, loaded.path, fixed_cuts, loaded.loss_fn, loaded.target
    )
