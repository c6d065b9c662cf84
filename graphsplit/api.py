"""The Python entry points: `transform` (plan + artifacts) and `parallelize` (this rank's part)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .compile import compile_program
from .errors import GraphsplitError
from .ir.program import Program
from .loader import LoadedModel, load_model
from .plan import Plan
from .report.summary import summarize


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
    loaded = load_model(model) if isinstance(model, str) else model
    module = loaded.build("meta")
    start = time.perf_counter()
    result = compile_program(module, loaded.args, loaded.kwargs, plan, loaded.path, fixed_cuts, loaded.loss_fn, loaded.target)
    summary = summarize(result.program, timings=result.timings)
    if out_dir is not None:
        from .report.artifacts import write_artifacts

        summary["transform_seconds"] = time.perf_counter() - start
        write_artifacts(result.program, loaded, Path(out_dir), summary)
    summary["transform_seconds"] = time.perf_counter() - start
    return TransformResult(result.program, summary, Path(out_dir) if out_dir is not None else None)


class PipelinedModule(nn.Module):
    """This rank's stages of a parallelized model.

    `train_step(*args, target=..., **kwargs)` runs one forward + backward of the
    whole pipeline over the micro-batches and returns the mean loss on the
    rank holding the last stage (None elsewhere). Gradients land in
    `.parameters()`: step any optimizer over them.
    """

    def __init__(self, pipeline: Any, persistent: set[str] | None = None, aliases: dict[str, str] | None = None) -> None:
        super().__init__()
        self.pipeline = pipeline
        # the original model's state_dict names (checkpoints skip non-persistent buffers) and tied aliases
        self._persistent = persistent or set()
        self._aliases = aliases or {}
        self.program: Program = pipeline.program
        self.stages = nn.ModuleDict({str(k): v for k, v in sorted(pipeline.modules.items())})

    def train_step(self, *args: Any, target: Any = None, **kwargs: Any) -> torch.Tensor | None:
        inputs = self.program.traced.flatten_inputs(args, kwargs)
        if target is None:
            target = torch.zeros(inputs[0].shape[0], device=inputs[0].device)
        loss, output = self.pipeline.step(inputs, target)
        # vocab-parallel cross-entropy keeps logits sharded: there is no whole output to show
        whole = output is not None and not self.program.sharded_outputs
        self.last_output = self.program.unflatten_output(output) if whole else None
        return loss

    def grads(self) -> dict[str, torch.Tensor]:
        """This rank's gradients under the original model's parameter names."""
        return self.pipeline.grads()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """`optimizer.step()`, through the plan's loss scaler under fp16 autocast (every rank must call it).

        Returns False when an fp16 overflow on any rank made every rank skip the step.
        """
        return self.pipeline.optimizer_step(optimizer)

    def save_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None, step: int = 0) -> None:
        """Every rank calls this: a torch.distributed.checkpoint folder under the original model's names,
        loadable at any other plan (and by `graphsplit export-weights`); written whole or not at all."""
        from .runtime.dcp.state import save_checkpoint

        state = self._checkpoint_state(optimizer)
        record = {"plan": self.program.plan.to_dict(), "model": "parallelize()", "aliases": self._aliases,
                  "optimizer": type(optimizer).__name__.lower() if optimizer is not None else None}
        save_checkpoint(directory, state, step, record)

    def load_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Every rank calls this: fill this rank's tensors (and `optimizer`'s state) from a checkpoint
        written at any plan (or the newest in a `run --save` folder); returns the step it was saved at."""
        from .runtime.dcp.record import read_info
        from .runtime.dcp.series import resolve_checkpoint
        from .runtime.dcp.state import init_optimizer_state, load_checkpoint

        directory = resolve_checkpoint(directory)
        if optimizer is not None:
            init_optimizer_state(optimizer)
        same_world = read_info(directory).get("plan") == self.program.plan.to_dict()
        return load_checkpoint(directory, self._checkpoint_state(optimizer), same_world)

    def _checkpoint_state(self, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        from .runtime.dcp.state import rank_state, scaler_state

        tp_rank = self.pipeline.mesh.get_local_rank("tp")
        state = rank_state(self.program, self.pipeline.modules, optimizer, tp_rank, self._persistent)
        state.update(scaler_state(self.pipeline.scaler))
        return state

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise GraphsplitError("a pipelined model trains through train_step(*inputs, target=...), not forward()")


def parallelize(
    model: nn.Module,
    plan: Plan,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    example_target: Any = None,
    timeout_s: float = 120.0,
) -> PipelinedModule:
    """Inside a torchrun process: build this rank's part of `model` under `plan`.

    `example_inputs` (and the batches given to `train_step`) are this rank's batch:
    with dp > 1 each replica feeds its own share, as with DDP; gradients and the
    returned loss are averaged over the replicas.

    A model with real weights is sliced (each rank copies only its stages'
    tensors); a model built on `meta` is initialized per module with its own
    `reset_parameters()`, seeded by module name.
    """
    from .backends.torch_distributed import (
        DistributedPipeline,
        init_distributed,
        make_mesh,
        materialize_rank,
    )
    from .runtime.dcp.record import model_names
    from .runtime.materialize import model_tensors
    from .runtime.training import make_loss

    args, kwargs = (example_inputs, {}) if isinstance(example_inputs, tuple) else ((), dict(example_inputs))
    device = init_distributed(timeout_s)
    mesh = make_mesh(plan, device)
    program = compile_program(model, args, kwargs, plan, loss_fn=loss_fn, target=example_target, global_batch=False).program
    on_meta = any(t.device.type == "meta" for t in model.parameters())
    source = None if on_meta else model_tensors(model)
    modules = materialize_rank(program, mesh, device, source)
    persistent, aliases = model_names(model)
    pipeline = DistributedPipeline(program, modules, make_loss(program, loss_fn), mesh, device)
    return PipelinedModule(pipeline, persistent, aliases)
