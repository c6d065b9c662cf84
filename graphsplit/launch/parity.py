"""Parity: the untouched model against the transformed program, in one module.

The reference is the untouched model in one process on the whole global batch (`reference.py`
trains it as `run` trains the program). Random ops are found and named (`random_ops.py`): dropout is
compared switched off on both sides. `compare` checks outputs, loss and gradients
with fp32 tolerances scaled by magnitude: |a - b| <= tol * max(1, max|b|), where tol is atol, or
more for a value the untouched model's own fp32 result is that far from its float64 result
(`NOISE_FACTOR` times that distance): BatchNorm over a few samples amplifies the rounding of any
summation order, so a healthy program's gradients differ from the fp32 reference by what the
reference differs from exact arithmetic; a wrong one differs by far more.
`check_ranks` compares what each rank of a program reports of its first step
(its gradients against the matching slice of the original gradients), whether
the ranks were processes (`check_run`, from their dumps) or the local backend's
threads (`check_locally`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ..ir.program import Program
from ..ir.sharding import shard_tensor, unpad
from ..ir.traced import Traced
from ..loader import LoadedModel
from ..plan import Plan
from ..runtime.microbatch import (
    batch_size,
    join_outputs,
    join_sequence,
    stage_output_dims,
)
from ..runtime.training import OptimConfig, default_loss, default_target
from .random_ops import RandomOps, find_random_ops, no_dropout, seeded, streams_match
from .reference import (
    PreciseRun,
    ReferenceRun,
    StepResult,
    precise_step,
    reference_step,
    reordered_step,
)
from .reference_batch import ReferenceBatch, reference_batch

ATOL = 1e-5
LOSS_CURVE_RTOL = 1e-4
# a value may differ from the fp32 reference by this many times the distance of the fp32 reference from
# the float64 one (the untouched model's own rounding noise; two fp32 runs in other orders each lie about
# that far from exact arithmetic)
NOISE_FACTOR = 10.0
# bf16 matmuls keep 8 bits of mantissa: loss and outputs agree with fp32 to about 1e-2, and
# gradients are not compared element by element (they are reported)
LOW_PRECISION_ATOL = 5e-2


@dataclass
class Comparison:
    max_diff: dict[str, float] = field(default_factory=dict)  # what -> scaled max |a - b|
    failures: list[str] = field(default_factory=list)
    # what was compared with what, where it is not the whole batch as it is (BatchNorm, random ops)
    notes: list[str] = field(default_factory=list)
    # what -> the tolerance used, where the reference's own noise raised it above atol
    tolerances: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def worst(self) -> tuple[str, float]:
        if not self.max_diff:
            return ("nothing", 0.0)
        key = max(self.max_diff, key=self.max_diff.__getitem__)
        return key, self.max_diff[key]


def _scaled_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    # a sparse gradient (nn.EmbeddingBag(sparse=True)) is compared as the dense tensor it stands for
    a = (a.to_dense() if a.is_sparse else a).detach().double()
    b = (b.to_dense() if b.is_sparse else b).detach().double()
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else float("inf")
    scale = max(1.0, float(b.abs().max()))
    return float((a - b).abs().max()) / scale


def compare(
    got_loss: torch.Tensor | None,
    got_output: Any,
    got_grads: Mapping[str, torch.Tensor],
    ref: StepResult,
    atol: float = ATOL,
    expected: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    held: Collection[str] = (),
    precise: StepResult | None = None,
    reordered: StepResult | None = None,
) -> Comparison:
    """`expected(name, full_reference_grad)` gives what this rank should hold (its tp shard).
    `precise`: the reference step in float64 (`reference.precise_step`), whose distance from `ref` (and
    from `reordered`, the fp32 step in another summation order: two samples of the noise) raises a value's
    tolerance above `atol` (NOISE_FACTOR times the larger).

    Which parameters have a gradient must agree too: one the original model leaves None (it
    ran under no_grad, or is frozen) fails, and so does each parameter in `held` (the ones
    this part holds) that has a reference gradient but none here."""
    cmp = Comparison()

    def check(what: str, a: torch.Tensor, b: torch.Tensor, exact: torch.Tensor | None,
              other: torch.Tensor | None = None) -> None:
        d = _scaled_diff(a, b)
        cmp.max_diff[what] = d
        tol = atol
        if exact is not None and atol < float("inf"):
            noise = _scaled_diff(b, exact)
            if other is not None:
                noise = max(noise, _scaled_diff(other, exact))
            tol = max(atol, NOISE_FACTOR * noise)
            if tol > atol:
                cmp.tolerances[what] = tol
        if not d <= tol:
            cmp.failures.append(f"{what}: max scaled difference {d:.3g} > {tol:.3g}")

    if got_loss is not None:
        check("loss", got_loss, ref.loss, precise.loss if precise is not None else None,
              reordered.loss if reordered is not None else None)
    if got_output is not None:
        got_leaves = [t for t in pytree.tree_leaves(got_output) if isinstance(t, torch.Tensor)]
        ref_leaves = [t for t in pytree.tree_leaves(ref.output) if isinstance(t, torch.Tensor)]
        exact_leaves = ([t for t in pytree.tree_leaves(precise.output) if isinstance(t, torch.Tensor)]
                        if precise is not None else [])
        if len(got_leaves) != len(ref_leaves):
            cmp.failures.append(f"output: {len(got_leaves)} tensors, the original model gives {len(ref_leaves)}")
        for i, (a, b) in enumerate(zip(got_leaves, ref_leaves)):
            check(f"output[{i}]", a, b, exact_leaves[i] if i < len(exact_leaves) else None)
    for name, g in got_grads.items():
        if name not in ref.grads:
            cmp.failures.append(f"grad {name}: the original model has no gradient for it")
            continue
        want = ref.grads[name] if expected is None else expected(name, ref.grads[name])
        exact = precise.grads.get(name) if precise is not None else None
        other = reordered.grads.get(name) if reordered is not None else None
        if expected is not None:
            exact = expected(name, exact) if exact is not None else None
            other = expected(name, other) if other is not None else None
        check(f"grad {name}", g, want, exact, other)
    for name in sorted(held):
        if name in ref.grads and name not in got_grads:
            cmp.failures.append(f"grad {name}: the original model has a gradient for it, this part has none")
    return cmp


def missing_grads(ref: StepResult, got: set[str]) -> list[str]:
    """Parameters with a reference gradient that no part of the program produced (aliases count once)."""
    return [
        names[0]
        for names in ref.aliases
        if any(n in ref.grads for n in names) and not any(n in got for n in names)
    ]


@dataclass
class RankStep:
    """What one rank reports of its first step: its gradients (its tp shards, by original name) and,
    on the last stage, the loss and the whole output (sharded outputs gathered)."""

    rank: int
    stages: tuple[int, ...]  # the stages it holds
    grads: dict[str, torch.Tensor]
    loss: torch.Tensor | None = None
    output: Any = None
    tp_rank: int = 0
    dp_rank: int = 0


def check_ranks(program: Program, ranks: Sequence[RankStep], first: StepResult, grads: bool = True,
                precise: StepResult | None = None, reordered: StepResult | None = None) -> Comparison:
    """Every rank's step 1 against the untouched model's: the loss, the output (the dp replicas'
    shares joined in order), and (`grads`) each rank's gradients against the matching slice of the
    original ones, every parameter it holds having one exactly when the original has one."""
    plan = program.plan
    low = plan.autocast is not None
    loss, replica_outputs = None, {}
    for r in ranks:
        if r.loss is not None:
            loss = r.loss
            if r.tp_rank == 0:
                replica_outputs[r.dp_rank] = r.output
    output = None
    if replica_outputs:  # each dp replica computed its share of the batch (cp ranks: a shard of its sequences)
        shares = [join_sequence(program, [replica_outputs[d] for d in range(first, first + plan.cp)])
                  for first in range(0, plan.dp, plan.cp)]
        output = program.unflatten_output(join_outputs(shares, stage_output_dims(program)))
    cmp = compare(loss, output, {}, first, atol=LOW_PRECISION_ATOL if low else ATOL, precise=None if low else precise,
                  reordered=reordered)
    for r in ranks if grads else ():
        def shard(name: str, full: torch.Tensor, tp_rank: int = r.tp_rank, ep_rank: int = r.dp_rank % plan.ep) -> torch.Tensor:
            return program.expert_slice(name, shard_tensor(full, program.param_sharding(name), tp_rank, plan.tp, pad=False),
                                        ep_rank)

        # a padded vocabulary's padding rows are no part of the model: only the real rows are compared
        grads = {k: unpad(g, program.param_sharding(k), r.tp_rank, plan.tp) for k, g in r.grads.items()}
        held = {c for s in r.stages for c in program.stages[s].param_sources.values()}
        sub = compare(None, None, grads, first, atol=float("inf") if low else ATOL, expected=shard, held=held,
                      precise=precise, reordered=reordered)
        cmp.max_diff.update({f"{k} (rank {r.rank})": v for k, v in sub.max_diff.items()})
        cmp.tolerances.update({f"{k} (rank {r.rank})": v for k, v in sub.tolerances.items()})
        cmp.failures.extend(f"rank {r.rank}: {f}" for f in sub.failures)
    missing = missing_grads(first, {k for r in ranks for k in r.grads})
    if missing and grads:
        cmp.failures.append(f"no rank produced a gradient for {', '.join(sorted(missing)[:5])}")
    return cmp


def check_notes(cut: ReferenceBatch, randoms: RandomOps, plan: Plan) -> list[str]:
    """What the check compares where it is not the untouched model on the whole batch as it is."""
    notes = [f"{cut.why}: compared with the untouched model {cut.describe()}"] if cut.why else []
    return notes + randoms.notes(streams_match(plan))


def check_locally(loaded: LoadedModel, plan: Plan, fixed_cuts: tuple[str, ...] | None = None,
                  compile_backend: str = "inductor", traced: Traced | None = None) -> tuple[Program, Comparison]:
    """Compile `loaded` under `plan`, run step 1 of every stage, tp shard and dp replica in this
    process (the local backend), and compare loss, output and every shard's gradients with the untouched
    model on the whole batch (`reference_batch`; dropout off on both sides, `random_ops`).
    `compile_backend`: torch.compile's backend when the plan compiles its stages. `traced`: its
    trace (`compile.trace_loaded`), reused instead of tracing again."""
    from ..backends.local import LocalProgram
    from ..compile import compile_loaded
    from ..runtime.materialize import model_tensors

    model = loaded.build("cpu", seed=plan.seed)
    program = compile_loaded(loaded, plan, fixed_cuts, traced).program
    randoms = find_random_ops(program.traced.gm)
    within = no_dropout if randoms.dropouts else contextlib.nullcontext
    local = LocalProgram(program, model_tensors(model), loaded.loss_fn, compile_backend)
    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    target = loaded.target if loaded.target is not None else default_target(inputs, batch_size(program, inputs))
    everything = tuple(range(len(program.stages)))
    tp = program.plan.tp
    with seeded(plan.seed):  # both sides draw from one seed (alike where `streams_match`)
        ranks = [RankStep(s.dp_rank * tp + s.tp_rank, everything, s.grads, s.loss, s.output, s.tp_rank, s.dp_rank)
                 for s in local.step(inputs, target, within)]
    cut = reference_batch(model, program.plan)
    loss_fn = loaded.loss_fn or default_loss
    precise = reordered = None
    step = (loaded.args, loaded.kwargs, target, loss_fn, cut.pieces, cut.replicas, program)
    if not randoms.draws and plan.autocast is None:  # float64 draws are other numbers: no noise estimate there
        with within(), seeded(plan.seed):
            precise = precise_step(model, *step)
            reordered = reordered_step(model, *step) if precise is not None else None
    with within(), seeded(plan.seed):
        ref = reference_step(model, *step)
    cmp = check_ranks(program, ranks, ref, precise=precise, reordered=reordered)
    cmp.notes.extend(check_notes(cut, randoms, program.plan))
    return program, cmp


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _weight_noise(model: nn.Module, precise: PreciseRun | None) -> dict[str, float]:
    """Per parameter, how far a weight may be from the fp32 reference's after the run for the reference's
    own rounding noise alone: NOISE_FACTOR times its largest distance from the float64 twin's."""
    if precise is None:
        return {}
    wide = dict(precise.model.named_parameters(remove_duplicate=False))
    return {name: NOISE_FACTOR * float((p.detach().double() - wide[name].detach().double()).abs().max())
            for name, p in model.named_parameters(remove_duplicate=False) if name in wide and p.numel()}


def weight_tolerance(config: OptimConfig, steps: int) -> float:
    """How far each weight may be from the untouched model's after `steps` steps (scaled by magnitude).

    SGD moves a weight by lr x its gradient, so the gradients' fp32 tolerance carries over. AdamW
    divides by sqrt(v): on an element whose gradient is near zero, fp32 rounding (the ranks sum in
    another order) changes m / sqrt(v) by a visible fraction, and the update by up to a fraction of
    lr. 1% of lr per step bounds that, and stays far below what a wrong update does (an element
    moved by about lr: a missed clip, a wrong lr, decay or sign)."""
    if config.optimizer == "adamw":
        return max(ATOL, 0.01 * config.lr * steps)
    return ATOL


def check_weights_after(program: Program, folder: Path, model: nn.Module, atol: float,
                        noise: Mapping[str, float] | None = None) -> Comparison:
    """Each rank's parameters after the last step (its dump `weights<rank>.pt`) against the untouched
    model's after the same steps, sliced to that rank's tp shard. `noise`: per parameter, how far
    its weight may move for the reference's own rounding noise alone (absolute), added to `atol`."""
    cmp = Comparison()
    plan = program.plan
    reference = dict(model.named_parameters(remove_duplicate=False))
    for path in sorted(folder.glob("weights*.pt")):
        if not path.stem.removeprefix("weights").isdigit():
            continue  # not a rank's dump (the launcher's whole-model weights.pt for the ranks to slice)
        r = int(path.stem.removeprefix("weights"))
        tp_rank = r % plan.tp  # the mesh is (dp, pp, tp), tp fastest
        ep_rank = (r // (plan.pp * plan.tp)) % plan.ep
        for name, got in torch.load(path, weights_only=True).items():
            want = shard_tensor(reference[name].detach(), program.param_sharding(name), tp_rank, plan.tp)
            want = program.expert_slice(name, want, ep_rank)
            d = _scaled_diff(got, want)
            cmp.max_diff[f"weight {name} (rank {r})"] = d
            tol = atol + (noise or {}).get(name, 0.0) / max(1.0, float(want.abs().max()) if want.numel() else 1.0)
            if not d <= tol:
                cmp.failures.append(f"rank {r}: weight {name} after the last step: max scaled difference {d:.3g} > {tol:.3g}")
    return cmp


def check_run(program: Program, folder: Path, reference: ReferenceRun, echo: Callable[[str], None],
              first_step: int = 1, grads: bool = True, model: nn.Module | None = None,
              weights_atol: float = ATOL, randoms: RandomOps | None = None) -> Comparison:
    """`run --check`: the ranks' dumps in `folder` against the reference run, reported through `echo`:
    step 1's loss, output and gradients, the loss curve, the global gradient norm of every step, the
    eval losses, and (`model`: the untouched model after the reference run) every rank's weights
    after the last step, within `weights_atol` (`weight_tolerance`); `randoms`: the random ops, named in
    the report (dropout was off on both sides). `grads=False`: the first step overflowed in fp16, its gradients are
    infinite by definition and are not compared (the loss curve still is). The reference's float64 twin
    (`reference.precise`), where there is one, raises each tolerance to what the reference's own rounding
    noise needs (NOISE_FACTOR times its distance from the twin), and the report says so."""
    plan = program.plan
    first, ref_losses, precise = reference.first, reference.losses, reference.precise
    ranks = [RankStep(**torch.load(p, weights_only=False)) for p in sorted(folder.glob("rank*.pt"))]
    low = plan.autocast is not None
    cmp = check_ranks(program, ranks, first, grads, precise=precise.first if precise is not None and not low else None,
                      reordered=precise.reordered if precise is not None and not low else None)
    curve_rtol = LOW_PRECISION_ATOL if low else LOSS_CURVE_RTOL
    norm_rtol = curve_rtol
    if precise is not None and not low:  # the reference's own noise in its losses and gradient norms, step by step
        curve_rtol = max(curve_rtol, NOISE_FACTOR * max(map(_relative, ref_losses, precise.losses), default=0.0))
        norm_rtol = max(norm_rtol, NOISE_FACTOR * max(map(_relative, reference.norms, precise.norms), default=0.0))
    curve = json.loads((folder / "losses.json").read_text())
    worst_curve = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curve, ref_losses))
    if not worst_curve <= curve_rtol:
        cmp.failures.append(f"loss curve: max relative difference {worst_curve:.3g} > {curve_rtol:.3g}")
    norms = json.loads((folder / "norms.json").read_text())
    finite = [(a, b) for a, b in zip(norms, reference.norms) if abs(b) != float("inf") and b == b]
    worst_norm = max((abs(a - b) / max(abs(b), 1e-12) for a, b in finite), default=0.0)
    if not low and not worst_norm <= norm_rtol:
        cmp.failures.append(f"gradient norm: max relative difference {worst_norm:.3g} > {norm_rtol:.3g}")
    evals = {int(k): v for k, v in json.loads((folder / "eval.json").read_text()).items()}
    if set(evals) != set(reference.eval_losses):
        cmp.failures.append(f"eval: the program evaluated after steps {sorted(evals)}, the reference after "
                            f"{sorted(reference.eval_losses)}")
    worst_eval = max((abs(v - reference.eval_losses[k]) / max(abs(reference.eval_losses[k]), 1e-12)
                      for k, v in evals.items() if k in reference.eval_losses), default=0.0)
    if not worst_eval <= curve_rtol:
        cmp.failures.append(f"eval loss: max relative difference {worst_eval:.3g} > {curve_rtol:g}")
    weights = Comparison()
    if model is not None and not low:  # bf16/fp16 weights drift apart by design
        weights = check_weights_after(program, folder, model, weights_atol, _weight_noise(model, precise))
        cmp.max_diff.update(weights.max_diff)
        cmp.failures.extend(weights.failures)
    loss = next(r.loss for r in ranks if r.loss is not None)
    cmp.notes.extend(check_notes(reference.batch, randoms or RandomOps(), plan))
    echo(f"check: untouched model in one process {reference.batch.describe()} vs graphsplit "
         f"dp={plan.dp}{' (fsdp)' if plan.fsdp else ''}{f' (cp={plan.cp})' if plan.cp > 1 else ''} pp={plan.pp} "
         f"tp={plan.tp}, {plan.sample_replicas * plan.num_microbatches} micro-batch"
         f"{'es' if plan.sample_replicas * plan.num_microbatches > 1 else ''}"
         + (f", each sequence cut over {plan.cp} ranks" if plan.cp > 1 else ""))
    for note in cmp.notes:
        echo(f"  note: {note}")
    echo(f"  loss step {first_step:<4}{float(first.loss):.6f} (reference) vs {float(loss):.6f}")
    out_diffs = [v for k, v in cmp.max_diff.items() if k.startswith("output")]
    grad_diffs = [v for k, v in cmp.max_diff.items() if k.startswith("grad")]
    echo(f"  output        max scaled difference {max(out_diffs, default=0.0):.3g}")
    if grads:
        n_grads = sum(len(r.grads) for r in ranks)
        echo(f"  gradients     {n_grads} tensors on {len(ranks)} ranks, max scaled difference {max(grad_diffs, default=0.0):.3g}")
    else:
        echo(f"  gradients     not compared: step {first_step} overflowed in fp16 (its gradients are infinite)")
    echo(f"  loss curve    {len(curve)} steps, max relative difference {worst_curve:.3g}")
    echo(f"  grad norm     {len(norms)} steps, max relative difference {worst_norm:.3g}")
    if evals:
        echo(f"  eval loss     {len(evals)} evaluations, max relative difference {worst_eval:.3g}")
    if weights.max_diff:
        echo(f"  weights       after step {first_step + len(curve) - 1}: {len(weights.max_diff)} tensors, "
             f"max scaled difference {max(weights.max_diff.values()):.3g} (within {weights_atol:g}"
             + (" or the reference's own noise x10)" if precise is not None else ")"))
    worst = cmp.worst
    if cmp.tolerances:
        what, tol = max(cmp.tolerances.items(), key=lambda kv: kv[1])
        echo(f"  tolerance     {len(cmp.tolerances)} values above {ATOL:g}, where the untouched model's own fp32 result "
             f"is that far from its float64 one (x{NOISE_FACTOR:g}): up to {tol:.3g} ({what})")
    if cmp.ok:
        atol = LOW_PRECISION_ATOL if low else ATOL
        rule = f"{plan.autocast} autocast: loss and outputs within {atol:g}, gradients reported" if low else \
            f"fp32 atol {ATOL:g} scaled by magnitude" + (", or the reference's own noise x10 above it" if cmp.tolerances else "")
        echo(f"check passed: largest difference {worst[1]:.3g} ({worst[0]}); {rule}")
    else:
        for f in cmp.failures[:20]:
            echo(f"  MISMATCH {f}")
        echo(f"check FAILED: {len(cmp.failures)} mismatch(es); largest difference {worst[1]:.3g} ({worst[0]})")
    return cmp
