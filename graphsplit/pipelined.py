"""`PipelinedModule`: this rank's part of a parallelized model, as a training script uses it.

A script written for one GPU or for DDP keeps its shape: its optimizer (given to `parallelize`,
changed in place), its LR schedule over `optimizer.param_groups`, its gradient accumulation
(`train_step(..., scale=1 / steps)` adds to the gradients as `(loss / steps).backward()` does),
its clipping (`clip_grad_norm_`), its validation (`evaluate`), its logging on rank 0 (the loss is
returned on every rank), its checkpoints (`save_checkpoint`/`load_checkpoint`, DCP folders under
the model's own names). The model is traced and cut on the first batch it is given, unless
`parallelize` was given `example_inputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from .errors import GraphsplitError
from .plan import Plan

if TYPE_CHECKING:
    from .backends.rank import RankProgram
    from .ir.program import Program
    from .runtime.replica import ReplicaBatch


@dataclass
class _Pending:
    """What building this rank's part needs; kept outside nn.Module's registry (the model's
    parameters are not this module's)."""

    model: nn.Module
    plan: Plan
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    example_target: Any
    timeout_s: float
    batch_dims: dict[str, int | None] | None
    optimizer: torch.optim.Optimizer | None
    resume: tuple[str | Path, torch.optim.Optimizer | None] | None = None


class PipelinedModule(nn.Module):
    """This rank's stages of a parallelized model.

    `train_step(*args, target=..., **kwargs)` runs one forward + backward of the
    whole pipeline over the micro-batches and returns the mean loss, on every rank.
    Gradients land in `.parameters()` and add up over calls until the optimizer's
    `zero_grad()`, as `loss.backward()` does. With `keep_output=True` the model's output on
    this rank's batch is kept in `.last_output` (the last stage's rank); by default it is
    dropped once the loss is computed, as an eager step drops its logits.

    Every rank of one dp replica trains on the batch its first rank (pp 0, tp 0) is given
    (the others receive it, as Megatron sends tp rank 0's batch), so a loop that draws its
    batches with a seed per rank stays right.
    """

    def __init__(self, pending: _Pending) -> None:
        super().__init__()
        self._pending: _Pending | None = pending
        self._samples = 0  # the batch size the pipeline was built for
        self.stages = nn.ModuleDict()
        self.last_output: Any = None

    # ---- building, on the first batch -------------------------------------------------------

    @property
    def built(self) -> bool:
        return self._pending is None

    def _build(self, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any) -> None:
        from .backends.rank import assemble_rank
        from .backends.torch_distributed import init_distributed
        from .rewrite import rewrite_program
        from .runtime.dcp.record import model_names
        from .runtime.materialize import model_tensors
        from .runtime.replica import ReplicaBatch, agreed_weights

        pending = self._pending
        assert pending is not None
        model = pending.model
        # graphsplit's set-up draws nothing from the script's random stream: its batches stay its own
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):
            device = init_distributed(pending.timeout_s)
            source = None
            if not any(t.device.type == "meta" for t in model.parameters()):
                # a DDP script seeds each rank its own way: every rank takes rank 0's weights, as DDP does
                source, differed = agreed_weights(model_tensors(model), device)
                if differed and torch.distributed.get_rank() == 0:
                    print(f"graphsplit: {len(differed)} of the model's tensors differed between ranks (a seed per "
                          "rank?); every rank takes rank 0's, as DDP does", flush=True)
            program = rewrite_program(model, args, kwargs, pending.plan, loss_fn=pending.loss_fn,
                                      target=target if target is not None else pending.example_target,
                                      global_batch=False, declared_batch=pending.batch_dims).program
            rank = assemble_rank(program, lambda stages: source, pending.loss_fn, model_names(model), pending.timeout_s)
            replica_batch = ReplicaBatch(rank.mesh, rank.device)
        self._attach(rank, replica_batch)
        from .runtime.microbatch import batch_size

        self._samples = batch_size(program, program.traced.flatten_inputs(args, kwargs))
        if pending.optimizer is not None:
            from .runtime.adopt_optimizer import adopt_optimizer, held_parameters

            sources = {i: s.param_sources for i, s in enumerate(program.stages)}
            adopt_optimizer(pending.optimizer, model, held_parameters(sources, rank.modules))
        self._pending = None
        if pending.resume is not None:
            self.rank_program.load_checkpoint(*pending.resume)

    def _attach(self, rank: RankProgram, replica_batch: ReplicaBatch | None) -> None:
        self.rank_program = rank
        self.pipeline = rank.pipeline
        self.program: Program = rank.program
        self._replica_batch = replica_batch
        for k, v in sorted(rank.modules.items()):
            self.stages[str(k)] = v

    def _ready(self, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any) -> tuple[tuple, dict, Any]:
        """Build on this batch if not built; every rank of the replica then holds its first rank's batch."""
        from .runtime.microbatch import batch_size

        if self._pending is not None:
            with torch.enable_grad():  # the stages are set up for training, even when built by evaluate()
                self._build(args, kwargs, target)
        if self._replica_batch is not None:
            args, kwargs, target = self._replica_batch((args, kwargs, target))
        # every rank of the replica holds the same batch now: all refuse it alike, before any collective
        samples = batch_size(self.program, self.program.traced.flatten_inputs(args, kwargs))
        if samples != self._samples:
            raise GraphsplitError(
                f"this batch holds {samples} samples and the pipeline was built for {self._samples} (its micro-batches' "
                f"shapes are fixed): give every step {self._samples} samples (a DataLoader's drop_last=True)")
        return args, kwargs, target

    def _require_built(self, what: str) -> None:
        if self._pending is not None:
            raise GraphsplitError(f"{what} needs the model built: call train_step() or evaluate() on a batch first, "
                                  "or give parallelize() example_inputs")

    # ---- where this rank stands ---------------------------------------------------------------

    @property
    def dp_rank(self) -> int:
        """This process's place on the mesh's dp axis (its data-parallel replica)."""
        self._require_built("dp_rank")
        return self.rank_program.dp_rank

    @property
    def tp_rank(self) -> int:
        """This process's place on the mesh's tp axis (which shard of each sharded tensor it holds)."""
        self._require_built("tp_rank")
        return self.rank_program.tp_rank

    # ---- training -------------------------------------------------------------------------------

    def _step(self, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any,
              keep_output: bool) -> tuple[torch.Tensor, dict[torch.Tensor, torch.Tensor]]:
        """One pipeline step; (the loss on every rank, the gradient it made for each parameter), the
        parameters' gradients left as they were before it."""
        from .runtime.microbatch import batch_size
        from .runtime.replica import loss_everywhere
        from .runtime.training import default_target

        args, kwargs, target = self._ready(args, kwargs, target)
        inputs = self.program.traced.flatten_inputs(args, kwargs)
        if target is None:
            target = default_target(inputs, batch_size(self.program, inputs))
        params = self.pipeline.parameters()
        held = {p: p.grad for p in params if p.grad is not None}
        for p in held:  # the step's own reductions (dp, tied copies) see this step's gradient alone
            p.grad = None
        loss, output = self.pipeline.step(inputs, target, keep_output)
        made = {p: p.grad for p in params if p.grad is not None}
        for p in params:
            p.grad = held.get(p)
        # vocab-parallel cross-entropy keeps logits sharded: there is no whole output to show
        whole = output is not None and not self.program.sharded_outputs
        self.last_output = self.program.unflatten_output(output) if whole else None
        return loss_everywhere(loss, self.rank_program.mesh, self.program.plan.pp, self.rank_program.device), made

    def train_step(self, *args: Any, target: Any = None, keep_output: bool = False, scale: float = 1.0,
                   **kwargs: Any) -> torch.Tensor:
        """Forward and backward over this rank's batch; the mean loss times `scale`, on every rank.

        The gradient of that scaled loss is *added* to the parameters' gradients, so a loop that
        accumulates `steps` batches before stepping passes `scale=1 / steps`, as it divided its loss."""
        loss, made = self._step(args, kwargs, target, keep_output)
        _add_grads(made, scale)
        return loss * scale

    def deferred_step(self, *args: Any, target: Any = None, **kwargs: Any) -> torch.Tensor:
        """Forward and backward over this rank's batch now; the loss, on every rank, whose `backward()`
        adds the gradients to the parameters, times the gradient it receives (`(loss / k).backward()`
        adds 1/k of them), as an eager forward's loss does. For loops that call `backward()` themselves
        (Lightning's): without it, the gradients are dropped."""
        loss, made = self._step(args, kwargs, target, False)
        leaf = loss.detach().requires_grad_()

        def add(grad: torch.Tensor) -> None:
            _add_grads(made, float(grad))
            made.clear()  # a second backward through the same loss adds nothing more

        leaf.register_hook(add)
        return leaf

    @torch.no_grad()
    def evaluate(self, *args: Any, target: Any = None, **kwargs: Any) -> torch.Tensor:
        """The mean loss over this batch, forward only, on every rank; dropout off, as under
        `model.eval()` (BatchNorm layers still normalize by the batch: see the guide)."""
        from .launch.random_ops import no_dropout
        from .runtime.microbatch import batch_size
        from .runtime.replica import loss_everywhere
        from .runtime.training import default_target

        args, kwargs, target = self._ready(args, kwargs, target)
        inputs = self.program.traced.flatten_inputs(args, kwargs)
        if target is None:
            target = default_target(inputs, batch_size(self.program, inputs))
        with no_dropout():
            loss = self.pipeline.evaluate(inputs, target)
        return loss_everywhere(loss, self.rank_program.mesh, self.program.plan.pp, self.rank_program.device)

    def clip_grad_norm_(self, max_norm: float, optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over the whole model: the 2-norm of every gradient on every
        rank (each counted once), every gradient scaled by one factor; the norm, on every rank. Under
        fp16 autocast `optimizer` is needed (its gradients are unscaled first)."""
        self._require_built("clip_grad_norm_")
        if self.pipeline.scaler is not None and optimizer is None:
            raise GraphsplitError("clip_grad_norm_ under fp16 autocast unscales the gradients first: pass the optimizer")
        return torch.tensor(self.pipeline.clip_grads(optimizer, max_norm))  # type: ignore[arg-type]

    def grads(self) -> dict[str, torch.Tensor]:
        """This rank's gradients under the original model's parameter names."""
        self._require_built("grads()")
        return self.pipeline.grads()

    def make_optimizer(self, optimizer_class: type[torch.optim.Optimizer], **kwargs: Any) -> torch.optim.Optimizer:
        """`optimizer_class(self.parameters(), **kwargs)`; under `Plan(zero=1)` its states sharded over the dp
        replicas (torch's ZeroRedundancyOptimizer: each replica steps its share and broadcasts it)."""
        self._require_built("make_optimizer()")
        if self.program.plan.zero != 1:
            return optimizer_class(self.parameters(), **kwargs)
        from .runtime.training import states_sharded

        return states_sharded(optimizer_class, self.parameters(), self.rank_program.mesh.get_group("dp"), **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """`optimizer.step()`, through the plan's loss scaler under fp16 autocast (every rank must call it).

        Returns False when an fp16 overflow on any rank made every rank skip the step.
        """
        self._require_built("optimizer_step()")
        return self.pipeline.optimizer_step(optimizer)

    # ---- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None, step: int = 0,
                        extra: Any = None) -> None:
        """Every rank calls this: a torch.distributed.checkpoint folder under the original model's names,
        loadable at any other plan (and by `graphsplit export-weights`); written whole or not at all.
        `extra`: the loop's own state (counters, a scheduler's `state_dict()`), rank 0's saved beside
        the tensors; `read_extra(directory)` gives it back."""
        self._require_built("save_checkpoint()")
        self.rank_program.save_checkpoint(directory, optimizer, step, self.rank_program.record("parallelize()", optimizer),
                                          extra)

    @staticmethod
    def read_extra(directory: str | Path) -> Any:
        """What `save_checkpoint(..., extra=...)` saved beside a checkpoint's tensors (None if nothing)."""
        from .runtime.dcp.state import read_extra

        return read_extra(directory)

    def load_checkpoint(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Every rank calls this: fill this rank's tensors (and `optimizer`'s state) from a checkpoint
        written at any plan (or the newest in a `run --save` folder); returns the step it was saved at.
        Before the first batch it is read once the model is built on it."""
        if self._pending is None:
            return self.rank_program.load_checkpoint(directory, optimizer)
        from .runtime.dcp.record import read_info
        from .runtime.dcp.series import resolve_checkpoint

        step = read_info(resolve_checkpoint(directory))["step"]  # a bad folder fails here, not at step 1
        self._pending.resume = (directory, optimizer)
        return step

    def forward(self, *args: Any, target: Any = None, **kwargs: Any) -> torch.Tensor:
        """Calling the module runs the pipeline on this batch and returns its loss, on every rank: in grad
        mode a training step whose loss's `backward()` adds the gradients (`deferred_step`), as an eager
        forward's loss does; under `torch.no_grad()` the evaluation loss (`evaluate`). The model's own
        outputs stay on the last stage (`train_step(..., keep_output=True)`)."""
        if torch.is_grad_enabled():
            return self.deferred_step(*args, target=target, **kwargs)
        return self.evaluate(*args, target=target, **kwargs)


def compiled_original(model: nn.Module, plan: Plan) -> tuple[nn.Module, Plan]:
    """A `torch.compile`d model is parallelized from the module it wraps, each stage then compiled
    (`Plan(compile=True)`): the compiled whole cannot be cut."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(model, OptimizedModule):
        from dataclasses import replace

        return model._orig_mod, replace(plan, compile=True)
    return model, plan


def _add_grads(made: dict[torch.Tensor, torch.Tensor], scale: float) -> None:
    """Add `scale` times each parameter's gradient in `made` to the gradient it holds."""
    for p, grad in made.items():
        if scale != 1.0:
            grad.mul_(scale)
        p.grad = grad if p.grad is None else p.grad.add_(grad)
