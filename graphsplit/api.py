"""The Python entry points: `transform` (plan + artifacts), `parallelize` (this rank's part, a
`PipelinedModule`: pipelined.py) and `price` (what a plan costs, before anything runs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from .errors import GraphsplitError
from .ir.program import Program
from .loader import LoadedModel, load_model
from .pipelined import PipelinedModule
from .plan import Plan
from .report.summary import summarize
from .rewrite import rewrite_program

if TYPE_CHECKING:
    from .planner.hardware import Hardware
    from .planner.price import Priced


@dataclass
class TransformResult:
    program: Program
    summary: dict[str, Any]
    out_dir: Path | None


def transform(
    model: str | LoadedModel,
    plan: Plan,
    out_dir: str | Path | None = None,
    fixed_cuts: tuple[str, ...] | None = None,
) -> TransformResult:
    """Plan and rewrite a model file; write plan.json and stage code to `out_dir` if given.

    `summary["transform_seconds"]` is the time from the loaded model to the
    written artifacts (model file import excluded).
    """
    if out_dir is not None:  # refuse a user's own folder before any work, not after it
        from .report.artifacts import require_out_dir

        require_out_dir(Path(out_dir))
    loaded = load_model(model, plan.seed) if isinstance(model, str) else model
    module = loaded.build("meta")
    start = time.perf_counter()
    result = rewrite_program(module, loaded.args, loaded.kwargs, plan, loaded.path, fixed_cuts, loaded.loss_fn, loaded.target,
                             declared_batch=loaded.batch_dims, buffers=loaded.buffer_values)
    summary = summarize(result.program, timings=result.timings)
    if out_dir is not None:
        from .report.artifacts import write_artifacts

        summary["transform_seconds"] = time.perf_counter() - start
        write_artifacts(result.program, loaded, Path(out_dir), summary)
    summary["transform_seconds"] = time.perf_counter() - start
    return TransformResult(result.program, summary, Path(out_dir) if out_dir is not None else None)


def price(
    model: str | LoadedModel | nn.Module,
    plan: Plan,
    hardware: str | Hardware = "h100",
    gpu_memory: int | str | None = None,
    gpus_per_node: int | None = None,
    optimizer: str = "adamw",
    compare: bool = True,
    example_inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    example_target: Any = None,
) -> Priced:
    """What `plan` costs a model file on `hardware` (a profile name or JSON file, or a `Hardware`), as
    `graphsplit plan` prices every candidate: its busiest rank's memory in its parts and its step time
    in its parts, whether it fits `gpu_memory` (bytes or "80GiB"; default the hardware's), and, with
    `compare`, the fastest plan the search finds on the same devices and what makes the difference
    (`Priced.versus_best()`). Nothing runs: the model is traced and measured on meta tensors.

    `model` may be a module already built (with its weights; no weight is copied): give its
    `example_inputs` (the global batch), and `loss_fn` and `example_target` as a model file would."""
    from .planner import load_hardware
    from .planner.price import price_plan
    from .planner.profile import profile_model
    from .report.advise import parse_bytes

    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    memory = parse_bytes(gpu_memory) if isinstance(gpu_memory, str) else gpu_memory or hw.memory_bytes
    if isinstance(model, nn.Module):
        from .loader import model_in_memory

        if example_inputs is None:
            raise GraphsplitError("price(module, ...) needs example_inputs=: the global batch it trains on")
        args, kwargs = (example_inputs, {}) if isinstance(example_inputs, tuple) else ((), dict(example_inputs))
        loaded = model_in_memory(model, args, kwargs, loss_fn, example_target)
    else:
        loaded = load_model(model) if isinstance(model, str) else model
    profile = profile_model(loaded, (plan.tp,), hw.fused_attention)
    return price_plan(profile, plan, hw, memory, None, gpus_per_node or hw.gpus_per_node, optimizer, compare)


def parallelize(
    model: nn.Module,
    plan: Plan,
    example_inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    example_target: Any = None,
    timeout_s: float = 120.0,
    batch_dims: dict[str, int | None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> PipelinedModule:
    """Inside a torchrun process: this rank's part of `model` under `plan`.

    The model is traced and cut on `example_inputs` (and `example_target`), or, without them, on
    the first batch given to `train_step` or `evaluate`. The batches given to `train_step` are this
    rank's replica's batch: with dp > 1 each replica feeds its own share, as with DDP; gradients
    and the returned loss are averaged over the replicas.

    A model with real weights is sliced (each rank copies only its stages' tensors; where ranks
    built it differently, rank 0's, as DDP takes); a model built on `meta` is initialized per
    module with its own `reset_parameters()`, seeded by module name. A `torch.compile`d model is
    parallelized from the module it wraps, each stage compiled.

    `optimizer`, built over `model`'s parameters (in groups, with its own hyper-parameters), is
    changed in place to step this rank's: the script keeps using it, its LR schedule too.

    The batch dim of each input is found in the graph (a seq-first model's is dim 1; a position
    table's is None: it goes whole to every micro-batch); `batch_dims` (input name -> dim or None)
    says it instead, as torch.distributed.pipelining's chunk specs do.
    """
    from .pipelined import _Pending, compiled_original

    model, plan = compiled_original(model, plan)
    if optimizer is not None and plan.zero == 1:
        raise GraphsplitError("Plan(zero=1) shards the optimizer's states with torch's ZeroRedundancyOptimizer: "
                              "build it with module.make_optimizer(cls, **kwargs) instead of passing optimizer=")
    module = PipelinedModule(_Pending(model, plan, loss_fn, example_target, timeout_s, batch_dims, optimizer))
    if example_inputs is not None:
        args, kwargs = (example_inputs, {}) if isinstance(example_inputs, tuple) else ((), dict(example_inputs))
        module._build(args, kwargs, example_target)
    return module
