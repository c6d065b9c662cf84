"""The reference: the untouched model, in this process, trained as `run` trains the program.

On the whole global batch, one forward and one backward per step (`reference_batch.py` says when
the model's own semantics need the program's pieces instead: BatchNorm without --sync-bn);
`reference_step` runs it on either (on pieces accumulating gradients as the schedules do: summed,
then divided by their number), cut along the program's batch dims; `reference_run` does so for
every step, with the optimizer, schedule and clipping `run` uses; `reference_eval` over eval_data().
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ..ir.program import Program
from ..loader import LoadedModel
from ..plan import Plan
from ..runtime.clip import squared_norm_share
from ..runtime.microbatch import (
    batch_size,
    call_dims,
    join_outputs,
    merge_outputs,
    split_microbatches,
)
from ..runtime.training import OptimConfig, default_loss, default_target
from .reference_batch import ReferenceBatch, reference_batch


@dataclass
class StepResult:
    loss: torch.Tensor
    output: Any
    grads: dict[str, torch.Tensor]
    # names that are one tensor in the model (tied weights), each group sorted
    aliases: list[list[str]] = field(default_factory=list)


def reference_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    microbatches: int = 1,
    replicas: int = 1,
    program: Program | None = None,
) -> StepResult:
    """One forward/backward of the untouched model: on the whole batch (`microbatches` 1, the
    reference), or over the pipeline's micro-batches (where the model's own semantics depend on
    the cut, `reference_batch.py`).

    `microbatches` counts all pieces (dp replicas x micro-batches, replica-major). With
    `replicas` > 1 (sync-bn: BatchNorm statistics span the replicas), the replicas'
    m-th micro-batches run as one batch, as the synchronized program sees them; the
    output is put back in replica-major order. `program`: whose batch dims cut the pieces (else dim 0).
    """
    model.zero_grad(set_to_none=True)
    in_dims = call_dims(program, args, kwargs) if program is not None else None
    t_dims = program.batch.target_dims(target) if program is not None else None
    out_dims = program.batch.outputs if program is not None and program.batch_dims is not None else None
    chunks = split_microbatches((args, kwargs), microbatches, in_dims)
    targets = split_microbatches(target, microbatches, t_dims)
    per = microbatches // replicas
    if replicas > 1:
        chunks = [merge_outputs([chunks[d * per + m] for d in range(replicas)], in_dims) for m in range(per)]
        targets = [merge_outputs([targets[d * per + m] for d in range(replicas)], t_dims) for m in range(per)]
    losses, outputs = [], []
    whole_loss = program is not None and bool(program.batch.whole_loss) and len(chunks) > 1
    kept = []  # a loss over the whole batch (a contrastive one) runs once, on the pieces' outputs joined
    for (a, k), t in zip(chunks, targets):
        out = model(*a, **k)
        if whole_loss:
            kept.append(out)
            continue
        loss = loss_fn(out, t)
        loss.backward()
        losses.append(loss.detach())
        outputs.append(pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out))
    if whole_loss:
        loss = loss_fn(join_outputs(kept, out_dims), merge_outputs(targets, t_dims))
        loss.backward()
        losses = [loss.detach()] * len(kept)  # every piece's share is the one loss (no division below)
        outputs = [pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out) for out in kept]
    if replicas > 1:
        parts = [split_microbatches(out, replicas, out_dims) for out in outputs]
        outputs = [parts[m][d] for d in range(replicas) for m in range(per)]
    grads, groups = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
        if p.grad is not None:
            if len(groups[id(p)]) == 1 and not whole_loss:  # a tied tensor is scaled once
                p.grad.div_(per)
            grads[name] = p.grad.detach().clone()
    aliases = [sorted(names) for names in groups.values()]
    return StepResult(torch.stack(losses).mean(), join_outputs(outputs, out_dims), grads, aliases)


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.to(torch.float64)
    return t.to(torch.complex128) if t.is_complex() else t


def widened(model: nn.Module) -> nn.Module:
    """A copy of the untouched model in float64 (complex128): beside the fp32 reference, how far fp32
    rounding alone moves each value, which `--check`'s tolerances are derived from (parity.py)."""
    import copy

    return copy.deepcopy(model)._apply(_wide)


def precise_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any,
                 loss_fn: Callable[[Any, Any], torch.Tensor], microbatches: int = 1, replicas: int = 1,
                 program: Program | None = None, wide_model: nn.Module | None = None) -> StepResult | None:
    """`reference_step` of the untouched model in float64 (`widened`, or `wide_model` already so) on the
    same batch, the generator left where it was (the fp32 step then draws what it would have). None when
    the model does not run in float64 (it fixes a dtype): no estimate, the fixed tolerance stands."""
    rng = torch.get_rng_state()
    try:
        precise = wide_model if wide_model is not None else widened(model)
        a, k, tgt = pytree.tree_map_only(torch.Tensor, _wide, (args, kwargs, target))
        return reference_step(precise, a, k, tgt, loss_fn, microbatches, replicas, program)
    except Exception:  # noqa: BLE001 - a model that fixes its dtypes
        return None
    finally:
        torch.set_rng_state(rng)


@contextlib.contextmanager
def _untouched_buffers(model: nn.Module) -> Iterator[None]:
    """The model's buffers as they were before: a step run only to measure the reference's spread must
    not move BatchNorm's running statistics (the eval losses read them)."""
    kept = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in kept:
                    b.copy_(kept[name])


def autocast_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any,
                  loss_fn: Callable[[Any, Any], torch.Tensor], microbatches: int = 1, replicas: int = 1,
                  program: Program | None = None, autocast: str = "bf16",
                  keep_buffers: bool = True) -> StepResult | None:
    """`reference_step` of the untouched model under `torch.autocast` in `autocast`'s dtype (on the
    device its parameters are on), the generator left where it was: how far that precision takes this
    model from its fp32 step (`--check`'s tolerance under `--autocast`, tolerance.py). None when the model
    does not run under autocast. `keep_buffers`: the model's buffers are put back after it (a step run on
    the reference itself, only to measure); a twin of its own keeps what its step made of them."""
    from .tolerance import LOW_DTYPES

    rng = torch.get_rng_state()
    device = next(iter(model.parameters()), torch.empty(0)).device.type
    try:
        kept = _untouched_buffers(model) if keep_buffers else contextlib.nullcontext()
        with torch.autocast(device, dtype=LOW_DTYPES[autocast]), kept:
            result = reference_step(model, args, kwargs, target, loss_fn, microbatches, replicas, program)
        # the loss and outputs as fp32 numbers (the program casts its outputs to fp32 too)
        return StepResult(result.loss.float(), pytree.tree_map_only(
            torch.Tensor, lambda t: t.float() if t.is_floating_point() else t, result.output), result.grads,
            result.aliases)
    except Exception:  # noqa: BLE001 - an op without a low-precision kernel here: no estimate
        return None
    finally:
        torch.set_rng_state(rng)


def reordered_step(model: nn.Module, *args: Any, **kwargs: Any) -> StepResult:
    """`reference_step` of the fp32 untouched model with another number of threads (1, or 2 where torch
    uses 1): its kernels sum in another order, a second sample of its own rounding noise beside the fp32
    reference's (the generator left where it was)."""
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        with _untouched_buffers(model):
            return reference_step(model, *args, **kwargs)
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)


@dataclass
class PreciseRun:
    """The untouched model trained beside the fp32 reference, step for step, in float64 (`autocast` None)
    or under torch.autocast in `autocast`'s dtype: step 1's result, each step's loss and gradient norm,
    and the model after the last step. Its distance from the reference is the reference's own spread (tolerance.py)."""

    first: StepResult
    losses: list[float]
    norms: list[float]
    model: nn.Module
    autocast: str | None = None


@dataclass
class ReferenceRun:
    """What the untouched model did over a run: step 1's result (and in float64: `precise_step`), and per
    step the loss, the gradient norm (before clipping, as `clip_grad_norm_` returns it) and, on eval
    steps, the eval loss."""

    first: StepResult
    losses: list[float]
    norms: list[float]
    eval_losses: dict[int, float] = field(default_factory=dict)
    batch: ReferenceBatch = field(default_factory=ReferenceBatch)  # what it ran on
    precise: PreciseRun | None = None  # the same run in float64 (or under torch.autocast)
    reordered: StepResult | None = None  # step 1 in fp32 summed in another order (fp32 plans)


def reference_run(model: nn.Module, loaded: LoadedModel, plan: Plan, steps: int, config: OptimConfig,
                  resume: str | None = None, first_step: int = 1, skipped: Collection[int] = (),
                  train_data: bool = False, data_start: int = 0, eval_every: int = 0,
                  program: Program | None = None, precise: bool = False,
                  autocast: str | None = None, nudge: bool = False) -> ReferenceRun:
    """Train the untouched model in this process as `run` trains the program: the same optimizer,
    lr schedule and clipping (`clip_grad_norm_` over its parameters), from the checkpoint `resume` if
    given, on the same global batches (train_data() from batch `data_start`, or example_inputs())
    each as one batch (or, `reference_batch`, the program's pieces where BatchNorm needs them).
    `skipped`: steps whose optimizer step the program skipped (fp16 overflows); the schedule still
    advances on them, as it does in the program. `precise`: the same run in float64 beside it, step for step,
    or (`autocast`) under torch.autocast in that dtype, or (`nudge`, a float8 reference) in float32 from
    weights one ulp away (`PreciseRun`: where rounding alone takes the reference)."""
    from ..runtime.data import Batch, DataSource
    from ..runtime.schedule import advance, make_scheduler

    loss_fn = loaded.loss_fn or default_loss
    opt = config.make_optimizer(list(model.parameters()))
    if resume:
        from ..runtime.dcp.state import load_whole_model

        load_whole_model(resume, model, opt)
    done = first_step - 1
    scheduler = make_scheduler(opt, config.lr_schedule, config.warmup_steps, done + steps, done)
    if train_data:
        assert loaded.train_data is not None
        source = DataSource("train_data", loaded.train_data, (loaded.args, loaded.kwargs), plan.seed, program=program)
        batches: Iterator[Batch] = source.global_batches(plan.sample_replicas, data_start)
    else:
        batches = itertools.repeat(Batch(loaded.args, loaded.kwargs, loaded.target))
    cut = reference_batch(model, plan)
    first, losses, norms, evals, reordered = None, [], [], {}, None
    twin = _Twin(model, config, done, steps, autocast, nudge) if precise else None
    for step in range(first_step, first_step + steps):
        batch = next(batches)
        target = batch.target if batch.target is not None else _stand_in(program, batch)
        if twin is not None:
            twin.step(step, batch.args, batch.kwargs, target, loss_fn, cut, program, skipped)
        if first is None and autocast is None:  # a second sample of fp32's noise: another summation order
            reordered = reordered_step(model, batch.args, batch.kwargs, target, loss_fn, cut.pieces,
                                       cut.replicas, program)
        result = reference_step(model, batch.args, batch.kwargs, target, loss_fn, cut.pieces, cut.replicas, program)
        first = first or result
        losses.append(float(result.loss))
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = squared_norm_share(grads).sqrt()  # as the ranks count it (sparse gradients too)
        if config.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(model.parameters(), config.grad_clip, norm)
        norms.append(float(norm))
        if step not in skipped:
            opt.step()
        opt.zero_grad(set_to_none=True)
        advance(scheduler)
        if eval_every and step % eval_every == 0:
            evals[step] = reference_eval(model, loaded, plan, program)
    assert first is not None, "at least one step"
    return ReferenceRun(first, losses, norms, evals, cut, twin.result() if twin is not None else None, reordered)


class _Twin:
    """The float64 copy of the reference (or, `autocast`, an fp32 copy run under torch.autocast), trained
    step for step beside it (same batches, optimizer, schedule and clipping); stops, and gives no result,
    where the model does not run so."""

    def __init__(self, model: nn.Module, config: OptimConfig, done: int, steps: int,
                 autocast: str | None = None, nudge: bool = False) -> None:
        import copy

        from ..runtime.schedule import make_scheduler
        from .fp8_reference import nudged

        self.autocast, self.nudge = autocast, nudge
        try:
            self.model: nn.Module | None = nudged(model) if nudge else \
                widened(model) if autocast is None else copy.deepcopy(model)
        except Exception:  # noqa: BLE001 - cannot be copied: no estimate
            self.model = None
        if self.model is not None:
            self.opt = config.make_optimizer(list(self.model.parameters()))
            self.scheduler = make_scheduler(self.opt, config.lr_schedule, config.warmup_steps, done + steps, done)
        self.config = config
        self.first: StepResult | None = None
        self.losses: list[float] = []
        self.norms: list[float] = []

    def step(self, step: int, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any, loss_fn: Any,
             cut: ReferenceBatch, program: Program | None, skipped: Collection[int]) -> None:
        from ..runtime.schedule import advance

        if self.model is None:
            return
        step_args = (args, kwargs, target, loss_fn, cut.pieces, cut.replicas, program)
        if self.nudge:
            result: StepResult | None = reference_step(self.model, *step_args)
        elif self.autocast is None:
            result = precise_step(self.model, *step_args, wide_model=self.model)
        else:
            result = autocast_step(self.model, *step_args, autocast=self.autocast, keep_buffers=False)
        if result is None:
            self.model = None
            return
        self.first = self.first or result
        self.losses.append(float(result.loss))
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = squared_norm_share(grads).sqrt()
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.config.grad_clip, norm)
        self.norms.append(float(norm))
        if step not in skipped:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        advance(self.scheduler)

    def result(self) -> PreciseRun | None:
        if self.model is None or self.first is None:
            return None
        return PreciseRun(self.first, self.losses, self.norms, self.model, self.autocast)


def _stand_in(program: Program | None, batch: Any) -> torch.Tensor:
    """The stand-in target of a batch: one zero per example."""
    if program is None:
        return default_target((*batch.args, *batch.kwargs.values()))
    flat = program.traced.flatten_inputs(batch.args, batch.kwargs)
    return default_target(flat, batch_size(program, flat))


def reference_eval(model: nn.Module, loaded: LoadedModel, plan: Plan, program: Program | None = None) -> float:
    """The untouched model's mean loss over one pass of eval_data(), forward only, each batch whole
    (or on the program's pieces where BatchNorm needs them, `reference_batch`)."""
    from ..runtime.data import DataSource

    assert loaded.eval_data is not None
    loss_fn = loaded.loss_fn or default_loss
    source = DataSource("eval_data", loaded.eval_data, (loaded.args, loaded.kwargs), plan.seed, shuffle=False,
                        program=program)
    means = []
    with torch.no_grad():
        for batch in source.global_batches(plan.sample_replicas, cycle=False):
            target = batch.target if batch.target is not None else _stand_in(program, batch)
            pieces = reference_batch(model, plan).pieces
            in_dims = call_dims(program, batch.args, batch.kwargs) if program is not None else None
            t_dims = program.batch.target_dims(target) if program is not None else None
            chunks = split_microbatches((batch.args, batch.kwargs), pieces, in_dims)
            losses = [loss_fn(model(*a, **k), t)
                      for (a, k), t in zip(chunks, split_microbatches(target, pieces, t_dims))]
            means.append(float(torch.stack(losses).mean()))
    return sum(means) / len(means)


def reference_train(model: nn.Module, loaded: LoadedModel, plan: Plan, steps: int, optimizer: str = "sgd",
                    lr: float = 0.01, resume: str | None = None, first_step: int = 1,
                    skipped: Collection[int] = ()) -> tuple[StepResult, list[float]]:
    """The first step's result and the loss of every step for the untouched model on example_inputs(),
    with a plain optimizer, from the checkpoint `resume` if given (`skipped`: steps whose optimizer step
    the program skipped, fp16 overflows)."""
    ref = reference_run(model, loaded, plan, steps, OptimConfig(optimizer, lr), resume, first_step, skipped)
    return ref.first, ref.losses


def reference_with_weights(loaded: LoadedModel, weights: str, plan: Plan) -> nn.Module:
    """The untouched model (one process) holding a weights file's values."""
    from ..runtime.weights import check_weights, open_weights

    model = loaded.build("cpu", seed=plan.seed)
    state = open_weights(weights)
    check_weights(state, model, weights)  # every parameter under one of its names: tied ones load through it
    model.load_state_dict({k: state[k] for k in state}, strict=False)
    return model
