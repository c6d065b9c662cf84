"""Model + inputs + Plan -> Program: trace, analyze, run the passes, cut."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .analysis.shapes import annotate
from .errors import GraphsplitError
from .ir.program import Program, build_program
from .ir.trace import Traced, trace_model
from .passes.manager import PassContext, run_passes
from .plan import Plan
from .runtime.microbatch import split_microbatches


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


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def first_microbatch(traced: Traced, flat: tuple[Any, ...], plan: Plan, replicas: int) -> tuple[Any, ...]:
    """One micro-batch of the inputs (each of `replicas` data-parallel replicas takes its share of
    the batch, then cuts it into the plan's micro-batches); the refusal names which factor does not fit."""
    n = plan.num_microbatches
    for name, t in zip(traced.input_names, flat):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            continue  # split_microbatches names a 0-d input
        batch = t.shape[0]
        shape = tuple(t.shape)
        if batch == 0:
            raise GraphsplitError(f"input {name!r} of shape {shape} is an empty batch; example_inputs() must give "
                                  f"at least {replicas * n} example(s) along dim 0 (the batch dim)")
        if batch % replicas:
            raise GraphsplitError(
                f"the batch of {batch} (input {name!r} of shape {shape}) cannot be shared equally by {replicas} "
                f"data-parallel replicas; use a --dp that divides {batch} ({_divisors(batch)}) or a batch divisible by {replicas}"
            )
        share = batch // replicas
        if share % n:
            whose = f"each replica's share ({share} of {batch})" if replicas > 1 else f"the batch of {batch}"
            if plan.microbatches is None:
                if plan.num_stages > 1:
                    _require_cut_places(traced, flat, plan)  # too many stages is the problem to report first
                why = f"by default one per pipeline stage, {n}"
            else:
                why = f"--microbatches {n}"
            raise GraphsplitError(
                f"{whose} (input {name!r} of shape {shape}) cannot be cut into equal micro-batches ({why}); "
                f"give --microbatches dividing {share} ({_divisors(share)}) or a batch divisible by {n * replicas}"
            )
    return split_microbatches(flat, replicas * n)[0]


def _require_cut_places(traced: Traced, flat: tuple[Any, ...], plan: Plan) -> None:
    """Analyze at the whole batch, only to count where the model can be cut (an error path)."""
    from .passes.pipeline_split import cut_places, too_few_cuts

    annotate(traced.gm, tuple(torch.as_tensor(t) for t in flat))
    places, operations = cut_places(traced.gm)
    if places < plan.num_stages - 1:
        raise too_few_cuts(plan.num_stages, plan.stages_per_rank, places, operations)


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
    check_call(model, args, kwargs, source)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    traced = trace_model(model, args, kwargs, source)
    timings["trace"] = time.perf_counter() - start
    flat = traced.flatten_inputs(args, kwargs)
    # Stages see micro-batches: analyze (shapes, bytes, FLOPs) at that size.
    pieces = plan.num_microbatches * (plan.dp if global_batch else 1)
    micro = first_microbatch(traced, flat, plan, plan.dp if global_batch else 1)
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
