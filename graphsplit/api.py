"""The Python entry points: `transform` (plan + artifacts), `parallelize` (this rank's part) and
`price` (what a plan costs, before anything runs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from .compile import compile_program
from .errors import GraphsplitError
from .ir.program import Program
from .loader import LoadedModel, load_model
from .plan import Plan
from .report.summary import summarize

if TYPE_CHECKING:
    from .backends.rank import RankProgram
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
    result = compile_program(module, loaded.args, loaded.kwargs, plan, loaded.path, fixed_cuts, loaded.loss_fn, loaded.target,
                             declared_batch=loaded.batch_dims, buffers=loaded.buffer_values)
    summary = summarize(result.program, timings=result.timings)
    if out_dir is not None:
        from .report.artifacts import write_artifacts

        summary["transform_seconds"] = time.perf_counter() - start
        write_artifacts(result.program, loaded, Path(out_dir), summary)
    summary["transform_seconds"] = time.perf_counter() - start
    return TransformResult(result.program, summary, Path(out_dir) if out_dir is not None else None)


def price(
    model: str | LoadedModel,
    plan: Plan,
    hardware: str | Hardware = "h100",
    gpu_memory: int | str | None = None,
    gpus_per_node: int | None = None,
    optimizer: str = "adamw",
    compare: bool = True,
) -> Priced:
    """What `plan` costs a model file on `hardware` (a profile name or JSON file, or a `Hardware`), as
    `graphsplit plan` prices every candidate: its busiest rank's memory in its parts and its step time
    in its parts, whether it fits `gpu_memory` (bytes or "80GiB"; default the hardware's), and, with
    `compare`, the fastest plan the search finds on the same devices and what makes the difference
    (`Priced.versus_best()`). Nothing runs: the model is traced and measured on meta tensors."""
    from .planner import load_hardware
    from .planner.price import price_plan
    from .planner.profile import profile_model
    from .report.advise import parse_bytes

    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    memory = parse_bytes(gpu_memory) if isinstance(gpu_memory, str) else gpu_memory or hw.memory_bytes
    loaded = load_model(model) if isinstance(model, str) else model
    profile = profile_model(loaded, (plan.tp,), hw.fused_attention)
    return price_plan(profile, plan, hw, memory, None, gpus_per_node or hw.gpus_per_node, optimizer, compare)


class PipelinedModule(nn.Module):
    """This rank's stages of a parallelized model.

    `train_step(*args, target=..., **kwargs)` runs one forward + backward of the
    whole pipeline over the micro-batches and returns the mean loss on the
    rank holding the last stage (None elsewhere). Gradients land in
    `.parameters()`: step any optimizer over them. With `keep_output=True` the
    model's output on this rank's batch is kept in `.last_output` (the last stage's
    rank); by default it is dropped once the loss is computed, as an eager step
    drops its logits.
    """

    def __init__(self, rank: RankProgram) -> None:
        super().__init__()
        self.rank_program = rank
        self.pipeline = rank.pipeline
        self.program: Program = rank.program
        self.stages = nn.ModuleDict({str(k): v for k, v in sorted(rank.modules.items())})

    @property
    def dp_rank(self) -> int:
        """This process's place on the mesh's dp axis (its data-parallel replica)."""
        return self.rank_program.dp_rank

    @property
    def tp_rank(self) -> int:
        """This process's place on the mesh's tp axis (which shard of each sharded tensor it holds)."""
        return self.rank_program.tp_rank

    def train_step(self, *args: Any, target: Any = None, keep_output: bool = False, **kwargs: Any) -> torch.Tensor | None:
        from .runtime.microbatch import batch_size
        from .runtime.training import default_target

        inputs = self.program.traced.flatten_inputs(args, kwargs)
        if target is None:
            target = default_target(inputs, batch_size(self.program, inputs))
        loss, output = self.pipeline.step(inputs, target, keep_output)
        # vocab-parallel cross-entropy keeps logits sharded: there is no whole output to show
        whole = output is not None and not self.program.sharded_outputs
        self.last_output = self.program.unflatten_output(output) if whole else None
        return loss

    def grads(self) -> dict[str, torch.Tensor]:
        """This rank's gradients under the original model's parameter names."""
        return self.pipeline.grads()

    def make_optimizer(self, optimizer_class: type[torch.optim.Optimizer], **kwargs: Any) -> torch.optim.Optimizer:
        """`optimizer_class(self.parameters(), **kwargs)`; under `Plan(zero=1)` its states sharded over the dp
        replicas (torch's ZeroRedundancyOptimizer: each replica steps its share and broadcasts it)."""
        if self.program.plan.zero != 1:
            return optimizer_class(self.parameters(), **kwargs)
        from .runtime.training import states_sharded

        return states_sharded(optimizer_class, self.parameters(), self.rank_program.mesh.get_group("dp"), **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """`optimizer.step()`, through the plan's loss scaler under fp16 autocast (every rank must call it).

        Returns False when an fp16 overflow on any rank made every rank skip the step.
        """
        return self.pipeline.optimizer_step(optimizer)

    def save_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None, step: int = 0) -> None:
        """Every rank calls this: a torch.distributed.checkpoint folder under the original model's names,
        loadable at any other plan (and by `graphsplit export-weights`); written whole or not at all."""
        self.rank_program.save_checkpoint(directory, optimizer, step, self.rank_program.record("parallelize()", optimizer))

    def load_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Every rank calls this: fill this rank's tensors (and `optimizer`'s state) from a checkpoint
        written at any plan (or the newest in a `run --save` folder); returns the step it was saved at."""
        return self.rank_program.load_checkpoint(directory, optimizer)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise GraphsplitError("a pipelined model trains through train_step(*inputs, target=...), not forward()")


def parallelize(
    model: nn.Module,
    plan: Plan,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    example_target: Any = None,
    timeout_s: float = 120.0,
    batch_dims: dict[str, int | None] | None = None,
) -> PipelinedModule:
    """Inside a torchrun process: build this rank's part of `model` under `plan`.

    `example_inputs` (and the batches given to `train_step`) are this rank's batch:
    with dp > 1 each replica feeds its own share, as with DDP; gradients and the
    returned loss are averaged over the replicas.

    A model with real weights is sliced (each rank copies only its stages'
    tensors); a model built on `meta` is initialized per module with its own
    `reset_parameters()`, seeded by module name.

    The batch dim of each input is found in the graph (a seq-first model's is dim 1; a position
    table's is None: it goes whole to every micro-batch); `batch_dims` (input name -> dim or None)
    says it instead, as torch.distributed.pipelining's chunk specs do.
    """
    from .backends.rank import assemble_rank
    from .runtime.dcp.record import model_names
    from .runtime.materialize import model_tensors

    args, kwargs = (example_inputs, {}) if isinstance(example_inputs, tuple) else ((), dict(example_inputs))
    program = compile_program(model, args, kwargs, plan, loss_fn=loss_fn, target=example_target, global_batch=False,
                              declared_batch=batch_dims).program
    on_meta = any(t.device.type == "meta" for t in model.parameters())
    source = None if on_meta else model_tensors(model)
    rank = assemble_rank(program, lambda stages: source, loss_fn, model_names(model), timeout_s)
    return PipelinedModule(rank)
