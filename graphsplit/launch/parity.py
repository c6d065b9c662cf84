"""Parity: the untouched model against the transformed program's first step.

The reference is the untouched model in one process on the whole global batch (`reference.py`
trains it as `run` trains the program). Random ops are found and named (`random_ops.py`): dropout is
compared switched off on both sides. `compare` checks loss, outputs and gradients, each tensor by its
relative error, within a tolerance derived from the reference's own spread (tolerance.py): its
float64 twin and another summation order for fp32 plans, its torch.autocast twin under --autocast.
`check_ranks` compares what each rank of a program reports of its first step (its gradients against
the matching slice of the original gradients), whether the ranks were processes (`run_check.py`, from
their dumps) or the local backend's threads (`check_locally`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..ir.program import Program
from ..ir.sharding import shard_tensor, unpad
from ..ir.traced_model import Traced
from ..loader import LoadedModel
from ..plan import Plan
from ..runtime.microbatch import (
    batch_size,
    join_outputs,
    join_sequence,
    stage_output_dims,
)
from ..runtime.training import default_loss, default_target
from .random_ops import RandomOps, find_random_ops, no_dropout, seeded, streams_match
from .reference import (
    StepResult,
    autocast_step,
    precise_step,
    reference_step,
    reordered_step,
)
from .reference_batch import ReferenceBatch, reference_batch
from .tolerance import Precision, floor_of, relative_error


@dataclass
class Comparison:
    max_diff: dict[str, float] = field(default_factory=dict)  # what -> relative error (tolerance.relative_error)
    failures: list[str] = field(default_factory=list)
    # what was compared with what, where it is not the whole batch as it is (BatchNorm, random ops)
    notes: list[str] = field(default_factory=list)
    # what -> the tolerance used, where the reference's own spread raised it above the precision's floor
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

    def merge(self, other: Comparison, suffix: str = "", prefix: str = "") -> None:
        self.max_diff.update({f"{k}{suffix}": v for k, v in other.max_diff.items()})
        self.tolerances.update({f"{k}{suffix}": v for k, v in other.tolerances.items()})
        self.failures.extend(f"{prefix}{f}" for f in other.failures)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def compare(
    got_loss: torch.Tensor | None,
    got_output: Any,
    got_grads: Mapping[str, torch.Tensor],
    ref: StepResult,
    precision: Precision | None = None,
    expected: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    held: Collection[str] = (),
    precise: StepResult | None = None,
    reordered: StepResult | None = None,
) -> Comparison:
    """Loss, output and gradients against the untouched model's step `ref`, each by its relative error
    (tolerance.py). `expected(name, full_reference_grad)` gives what this rank should hold (its tp shard).
    The reference's own spread sets each value's tolerance (`Precision.tolerance`): `precise` is the
    twin step (fp32 plans: in float64; `--autocast`: under torch.autocast), `reordered` the fp32 step
    summed in another order. The fp32 spread is the larger distance of the reference and the reordered
    step from the float64 twin (or of the reordered step from the reference, without a twin); under
    autocast, the twin's distance from the fp32 reference.

    Which parameters have a gradient must agree too: one the original model leaves None (it
    ran under no_grad, or is frozen) fails, and so does each parameter in `held` (the ones
    this part holds) that has a reference gradient but none here."""
    precision = precision or Precision()
    cmp = Comparison()
    grad_floor = floor_of(ref.grads.values())

    def spread(b: torch.Tensor, twin: torch.Tensor | None, other: torch.Tensor | None, floor: float) -> float | None:
        if precision.low:
            return relative_error(twin, b, floor) if twin is not None else None
        samples = [relative_error(b, twin, floor)] if twin is not None else []
        if other is not None:
            samples.append(relative_error(other, twin if twin is not None else b, floor))
        return max(samples, default=None)

    def check(what: str, a: torch.Tensor, b: torch.Tensor, twin: torch.Tensor | None,
              other: torch.Tensor | None = None, floor: float = 0.0) -> None:
        d = relative_error(a, b, floor)
        cmp.max_diff[what] = d
        tol = precision.tolerance(spread(b, twin, other, floor))
        if tol > precision.floor:
            cmp.tolerances[what] = tol
        if not d <= tol:
            cmp.failures.append(f"{what}: relative error {d:.3g} > {tol:.3g}")

    if got_loss is not None:
        check("loss", got_loss, ref.loss, precise.loss if precise is not None else None,
              reordered.loss if reordered is not None else None)
    if got_output is not None:
        got_leaves, ref_leaves = _tensors(got_output), _tensors(ref.output)
        twin_leaves = _tensors(precise.output) if precise is not None else []
        other_leaves = _tensors(reordered.output) if reordered is not None else []
        if len(got_leaves) != len(ref_leaves):
            cmp.failures.append(f"output: {len(got_leaves)} tensors, the original model gives {len(ref_leaves)}")
        for i, (a, b) in enumerate(zip(got_leaves, ref_leaves)):
            check(f"output[{i}]", a, b, twin_leaves[i] if i < len(twin_leaves) else None,
                  other_leaves[i] if i < len(other_leaves) else None)
    for name, g in got_grads.items():
        if name not in ref.grads:
            cmp.failures.append(f"grad {name}: the original model has no gradient for it")
            continue
        want = ref.grads[name] if expected is None else expected(name, ref.grads[name])
        twin = precise.grads.get(name) if precise is not None else None
        other = reordered.grads.get(name) if reordered is not None else None
        if expected is not None:
            twin = expected(name, twin) if twin is not None else None
            other = expected(name, other) if other is not None else None
        check(f"grad {name}", g, want, twin, other, grad_floor)
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
    """Every rank's step 1 against the untouched model's: the loss every last-stage rank reports, the
    output each tp rank of the last stage reports (the dp replicas' shares joined in order), and (`grads`)
    each rank's gradients against the matching slice of the original ones, every parameter it holds
    having one exactly when the original has one. What should be there and is not fails: no loss, a
    replica's output missing, a parameter no rank has a gradient for."""
    plan = program.plan
    precision = Precision.of(plan)
    cmp = Comparison()
    reporting = [r for r in ranks if r.loss is not None]
    if not reporting:
        cmp.failures.append("loss: no rank reported one (the last stage's ranks report the step's loss)")
    for r in reporting:
        one = compare(r.loss, None, {}, first, precision, precise=precise, reordered=reordered)
        if one.max_diff.get("loss", 0.0) >= cmp.max_diff.get("loss", 0.0):
            cmp.max_diff["loss"] = one.max_diff["loss"]
            cmp.tolerances.update(one.tolerances)
        cmp.failures.extend(f"rank {r.rank}: {f}" for f in one.failures)
    for tp_rank in sorted({r.tp_rank for r in reporting}):
        outputs = {r.dp_rank: r.output for r in reporting if r.tp_rank == tp_rank and r.output is not None}
        lacking = [d for d in range(plan.dp) if d not in outputs]
        if lacking:
            cmp.failures.append(f"output: dp replica(s) {lacking} of tp rank {tp_rank} reported none")
            continue
        # each dp replica computed its share of the batch (cp ranks: a shard of its sequences)
        shares = [join_sequence(program, [outputs[d] for d in range(first_rank, first_rank + plan.cp)])
                  for first_rank in range(0, plan.dp, plan.cp)]
        output = program.unflatten_output(join_outputs(shares, stage_output_dims(program)))
        one = compare(None, output, {}, first, precision, precise=precise, reordered=reordered)
        cmp.merge(one, suffix=f" (tp rank {tp_rank})" if tp_rank else "",
                  prefix=f"tp rank {tp_rank}: " if tp_rank else "")
    for r in ranks if grads else ():
        mine = program.on_ep_rank(r.dp_rank % plan.ep)  # a loop's expert slots by the experts this rank holds

        def shard(name: str, full: torch.Tensor, tp_rank: int = r.tp_rank, ep_rank: int = r.dp_rank % plan.ep,
                  mine: Program = mine) -> torch.Tensor:
            return mine.expert_slice(name, shard_tensor(full, mine.param_sharding(name), tp_rank, plan.tp, pad=False),
                                     ep_rank)

        # a padded vocabulary's padding rows are no part of the model: only the real rows are compared
        got = {k: unpad(g, mine.param_sharding(k), r.tp_rank, plan.tp) for k, g in r.grads.items()}
        held = {c for s in r.stages for c in mine.stages[s].param_sources.values()}
        one = compare(None, None, got, first, precision, expected=shard, held=held, precise=precise,
                      reordered=reordered)
        cmp.merge(one, suffix=f" (rank {r.rank})", prefix=f"rank {r.rank}: ")
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
    from ..rewrite import rewrite_loaded
    from ..runtime.materialize import model_tensors

    model = loaded.build("cpu", seed=plan.seed)
    program = rewrite_loaded(loaded, plan, fixed_cuts, traced).program
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
    if plan.fp8 is not None:  # torchao's float8 model; its spread from weights one ulp away (fp8_reference.py)
        from .fp8_reference import float8_reference, nudged

        model = float8_reference(model, program.fp8_modules, plan.fp8)
    with within(), seeded(plan.seed):  # the reference's own spread (tolerance.py)
        if plan.fp8 is not None:
            precise = reference_step(nudged(model), *step)
        elif plan.autocast is not None:
            precise = autocast_step(model, *step, autocast=plan.autocast)
        else:
            # float64 draws are other numbers: no float64 twin where the model draws
            precise = precise_step(model, *step) if not randoms.draws else None
            reordered = reordered_step(model, *step)
    with within(), seeded(plan.seed):
        ref = reference_step(model, *step)
    cmp = check_ranks(program, ranks, ref, precise=precise, reordered=reordered)
    cmp.notes.extend(check_notes(cut, randoms, program.plan))
    return program, cmp


