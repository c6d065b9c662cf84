"""`run --check`: a run's dumps against the untouched model's run, and the report.

The ranks of a checked run dump their first step (`rank<r>.pt`), the weights they hold after the last
step (`weights<r>.pt`), and the last stage's loss curve, gradient norms and eval losses (worker.py).
Each is compared with the reference run (`reference.reference_run`): step 1 by `parity.check_ranks`,
the curves step by step, the weights by their update (the weights after the run minus the weights
before it, tp-sliced), all by relative error within the reference's own spread (tolerance.py).
Whatever should be there and is not fails: a rank's dump, a step of a curve, a weight.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from ..ir.program import Program
from ..ir.sharding import shard_tensor
from .parity import Comparison, RankStep, check_notes, check_ranks
from .random_ops import RandomOps
from .reference import PreciseRun, ReferenceRun
from .tolerance import FLOOR, RTOL, Precision, norm, relative, relative_error

# The weights after a run are held to 1% of their update. Step 1's gradients are compared at the
# precision's own tolerance; after it, rounding compounds: each later step's gradient is taken at weights
# that already differ by an ulp, a BatchNorm channel of near-zero variance amplifies that, fp32 storage
# rounds an update small beside its weight (w - lr g) to the weight's ulp, and AdamW's m / sqrt(v) turns
# a near-zero gradient's rounding into a visible fraction of lr. 1% bounds all of it on every model of
# the zoos, and stays far below what a wrong optimizer step does (a missed clip, a wrong lr, decay or
# sign, a rank that did not step: the update off by about itself, or 10% for a gradient 10% off).
UPDATE_RTOL = 1e-2


def weight_tolerance(precision: Precision | None = None) -> float:
    """The smallest relative error the weights' update after a run may have (UPDATE_RTOL, or the
    precision's floor where that is larger), whatever the optimizer."""
    return max((precision or Precision()).floor, UPDATE_RTOL)


def check_weights_after(program: Program, folder: Path, model: nn.Module, initial: Mapping[str, torch.Tensor],
                        rtol: float, twin: PreciseRun | None = None) -> Comparison:
    """Each rank's parameters after the last step (its dump `weights<rank>.pt`) against the untouched
    model's after the same steps, both as updates from `initial` (the weights before the run), sliced to
    that rank's tp shard: relative error of the update within `rtol`, or the twin's (`twin`: the reference's
    float64 or autocast twin) own distance times the precision's factor where that is larger. Every rank
    must have written its dump, and every parameter must be on some rank."""
    plan = program.plan
    precision = Precision.of(plan)
    cmp = Comparison()
    reference = dict(model.named_parameters(remove_duplicate=False))
    wide = dict(twin.model.named_parameters(remove_duplicate=False)) if twin is not None else {}
    updates = {k: reference[k].detach() - initial[k] for k in reference if k in initial}
    floor = FLOOR * max((norm(u) for u in updates.values()), default=0.0)
    dumps = {int(p.stem.removeprefix("weights")): p for p in folder.glob("weights*.pt")
             if p.stem.removeprefix("weights").isdigit()}  # not the launcher's whole-model weights.pt
    lacking = [r for r in range(plan.world_size) if r not in dumps]
    if lacking:
        cmp.failures.append(f"weights after the last step: rank(s) {lacking} wrote none")
    seen: set[str] = set()
    for r, path in sorted(dumps.items()):
        tp_rank = r % plan.tp  # the mesh is (dp, pp, tp), tp fastest
        ep_rank = (r // (plan.pp * plan.tp)) % plan.ep

        held = program.on_ep_rank(ep_rank)  # a loop's expert slots by the experts this rank holds

        def mine(full: torch.Tensor, name: str, tp_rank: int = tp_rank, ep_rank: int = ep_rank,
                 held: Program = held) -> torch.Tensor:
            return held.expert_slice(name, shard_tensor(full, held.param_sharding(name), tp_rank, plan.tp), ep_rank)

        for name, got in torch.load(path, weights_only=True).items():
            if name not in updates:
                cmp.failures.append(f"rank {r}: weight {name}: the original model has no such parameter")
                continue
            seen.add(name)
            start = mine(initial[name], name)
            want = mine(updates[name], name)
            d = relative_error(got.double() - start.double(), want, floor)
            what = f"weight {name} (rank {r})"
            cmp.max_diff[what] = d
            spread = None
            if name in wide:
                spread = relative_error(mine(wide[name].detach().double() - initial[name].double(), name), want, floor)
            tol = precision.tolerance(spread, rtol)
            if tol > rtol:
                cmp.tolerances[what] = tol
            if not d <= tol:
                cmp.failures.append(f"rank {r}: weight {name} after the last step: relative error of its update "
                                    f"{d:.3g} > {tol:.3g}")
    # a parameter the program holds nowhere must be one the run never moved (read by no op: dropped)
    unseen = sorted(k for k in updates if k not in seen and not _aliased(k, seen, model) and norm(updates[k]) > 0)
    if dumps and unseen:
        cmp.failures.append(f"weights after the last step: no rank holds {', '.join(unseen[:5])}")
    return cmp


def _aliased(name: str, seen: set[str], model: nn.Module) -> bool:
    """Whether `name` is a tied parameter one of whose other names was seen."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return any(params[other] is params[name] for other in seen if other in params)


def _curve(what: str, got: Sequence[float], want: Sequence[float], twin: Sequence[float] | None,
           precision: Precision, floor: float, cmp: Comparison) -> float:
    """One per-step series (losses, gradient norms) against the reference's: as many steps, each within
    the floor or the twin's own distance times the precision's factor. The worst relative error."""
    if len(got) != len(want):
        cmp.failures.append(f"{what}: the program reported {len(got)} steps, the reference ran {len(want)}")
    # fp16: a step whose gradients overflowed has an infinite norm by definition (it was skipped)
    finite = [(a, b) for a, b in zip(got, want) if _finite(b) and (_finite(a) or precision.autocast != "fp16")]
    worst = max((relative(a, b) for a, b in finite), default=0.0)
    spread = max((relative(t, b) for t, b in zip(twin, want) if _finite(b) and _finite(t)), default=0.0) \
        if twin else None
    tol = precision.tolerance(spread, floor)
    if not worst <= tol:
        cmp.failures.append(f"{what}: max relative difference {worst:.3g} > {tol:.3g}")
    return worst


def _finite(x: float) -> bool:
    return abs(x) != float("inf") and x == x


def _read(folder: Path, name: str, cmp: Comparison, default: object) -> object:
    path = folder / name
    if not path.exists():
        cmp.failures.append(f"{name}: the last stage wrote none")
        return default
    return json.loads(path.read_text())


def check_run(program: Program, folder: Path, reference: ReferenceRun, echo: Callable[[str], None],
              first_step: int = 1, grads: bool = True, model: nn.Module | None = None,
              initial: Mapping[str, torch.Tensor] | None = None, weights_rtol: float = RTOL,
              randoms: RandomOps | None = None) -> Comparison:
    """`run --check`: the ranks' dumps in `folder` against the reference run, reported through `echo`:
    step 1's loss, outputs and gradients, the loss curve, the global gradient norm of every step, the
    eval losses, and (`model`: the untouched model after the reference run, `initial`: its weights before)
    every rank's weights after the last step, by their update, within `weights_rtol` (`weight_tolerance`).
    `randoms`: the random ops, named in the report (dropout was off on both sides). `grads=False`: the
    first step overflowed in fp16, its gradients are infinite by definition and are not compared (the
    loss curve still is). The reference's twin (`reference.precise`: float64, or torch.autocast under
    --autocast) sets each tolerance from the reference's own spread (tolerance.py), and the report says so."""
    plan = program.plan
    precision = Precision.of(plan)
    first, twin = reference.first, reference.precise
    ranks = [RankStep(**torch.load(p, weights_only=False)) for p in sorted(folder.glob("rank*.pt"))]
    lacking = sorted(set(range(plan.world_size)) - {r.rank for r in ranks})
    cmp = check_ranks(program, ranks, first, grads, precise=twin.first if twin is not None else None,
                      reordered=reference.reordered)
    if lacking:
        cmp.failures.append(f"step 1: rank(s) {lacking} wrote no dump")
    curve = _read(folder, "losses.json", cmp, [])
    norms = _read(folder, "norms.json", cmp, [])
    assert isinstance(curve, list) and isinstance(norms, list)
    worst_curve = _curve("loss curve", curve, reference.losses, twin.losses if twin else None, precision,
                         precision.curve_floor, cmp)
    worst_norm = _curve("gradient norm", norms, reference.norms, twin.norms if twin else None, precision,
                        precision.curve_floor, cmp)
    evals = {int(k): v for k, v in dict(_read(folder, "eval.json", cmp, {})).items()}  # type: ignore[call-overload]
    if set(evals) != set(reference.eval_losses):
        cmp.failures.append(f"eval: the program evaluated after steps {sorted(evals)}, the reference after "
                            f"{sorted(reference.eval_losses)}")
    worst_eval = max((relative(v, reference.eval_losses[k]) for k, v in evals.items() if k in reference.eval_losses),
                     default=0.0)
    eval_tol = precision.tolerance(max(map(relative, twin.losses, reference.losses), default=0.0) if twin else None,
                                   precision.curve_floor)
    if not worst_eval <= eval_tol:
        cmp.failures.append(f"eval loss: max relative difference {worst_eval:.3g} > {eval_tol:.3g}")
    weights = Comparison()
    if model is not None and initial is not None:
        weights = check_weights_after(program, folder, model, initial, weights_rtol, twin)
        cmp.merge(weights)
    cmp.notes.extend(check_notes(reference.batch, randoms or RandomOps(), plan))
    _report(program, cmp, ranks, reference, echo, first_step, grads, (curve, worst_curve), (norms, worst_norm),
            (evals, worst_eval), weights)
    return cmp


def _report(program: Program, cmp: Comparison, ranks: Sequence[RankStep], reference: ReferenceRun,
            echo: Callable[[str], None], first_step: int, grads: bool, curve: tuple[list, float],
            norms: tuple[list, float], evals: tuple[dict, float], weights: Comparison) -> None:
    plan = program.plan
    precision = Precision.of(plan)
    pieces = plan.sample_replicas * plan.num_microbatches
    echo(f"check: untouched model in one process {reference.batch.describe()} vs graphsplit "
         f"dp={plan.dp}{' (fsdp)' if plan.fsdp else ''}{f' (cp={plan.cp})' if plan.cp > 1 else ''} pp={plan.pp} "
         f"tp={plan.tp}, {pieces} micro-batch{'es' if pieces > 1 else ''}"
         + (f", each sequence cut over {plan.cp} ranks" if plan.cp > 1 else ""))
    for note in cmp.notes:
        echo(f"  note: {note}")
    losses = [r for r in ranks if r.loss is not None]
    if losses:
        echo(f"  loss step {first_step:<4}{float(reference.first.loss):.6f} (reference) vs {float(losses[0].loss):.6f}"
             + (f" ({len(losses)} ranks report it)" if len(losses) > 1 else ""))
    out_diffs = [v for k, v in cmp.max_diff.items() if k.startswith("output")]
    grad_diffs = [v for k, v in cmp.max_diff.items() if k.startswith("grad")]
    tp_ranks = len({r.tp_rank for r in losses})
    echo(f"  output        max relative error {max(out_diffs, default=0.0):.3g}"
         + (f" (each of {tp_ranks} tp ranks' outputs)" if tp_ranks > 1 else ""))
    if grads:
        n_grads = sum(len(r.grads) for r in ranks)
        echo(f"  gradients     {n_grads} tensors on {len(ranks)} ranks, max relative error {max(grad_diffs, default=0.0):.3g}")
    else:
        echo(f"  gradients     not compared: step {first_step} overflowed in fp16 (its gradients are infinite)")
    echo(f"  loss curve    {len(curve[0])} steps, max relative difference {curve[1]:.3g}")
    echo(f"  grad norm     {len(norms[0])} steps, max relative difference {norms[1]:.3g}")
    if evals[0]:
        echo(f"  eval loss     {len(evals[0])} evaluations, max relative difference {evals[1]:.3g}")
    if weights.max_diff:
        echo(f"  weights       after step {first_step + len(curve[0]) - 1}: {len(weights.max_diff)} tensors, "
             f"max relative error of their update {max(weights.max_diff.values()):.3g}")
    twin = reference.precise
    spread = ("torchao's float8 model from weights one ulp away" if precision.fp8 else
              "the untouched model under torch.autocast" if precision.low else "the untouched model in float64") \
        if twin is not None else ("another summation order" if reference.reordered is not None else "")
    if cmp.tolerances:
        what, tol = max(cmp.tolerances.items(), key=lambda kv: kv[1])
        echo(f"  tolerance     {len(cmp.tolerances)} values above {precision.floor:g}, from the reference's own spread "
             f"({spread}, x{precision.factor:g}): up to {tol:.3g} ({what})")
    elif precision.low and twin is None:
        echo(f"  tolerance     {precision.floor:g} for every value: the untouched model does not run under "
             "torch.autocast here, so its spread is unknown")
    worst = cmp.worst
    if cmp.ok:
        echo(f"check passed: largest relative error {worst[1]:.3g} ({worst[0]}); {precision.describe()}")
    else:
        for f in cmp.failures[:20]:
            echo(f"  MISMATCH {f}")
        if len(cmp.failures) > 20:
            echo(f"  ... and {len(cmp.failures) - 20} more")
        echo(f"check FAILED: {len(cmp.failures)} mismatch(es); largest relative error {worst[1]:.3g} ({worst[0]})")
