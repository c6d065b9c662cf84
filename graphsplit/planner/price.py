"""One given plan priced as the search prices each candidate, beside the search's best.

`graphsplit plan MODEL --gpus N --tp 8 --pp 16 ...` (or `--plan plan.json`) and `graphsplit.price()`:
the plan's memory in its parts and its step time in its parts, whether it fits, and how far it is
from the fastest plan the search finds on the same devices, with the parts that make the difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.attention_cores import NO_CORES
from ..errors import GraphsplitError
from ..plan import Plan
from .estimate import Estimate, estimate, plan_fields
from .hardware import Hardware
from .profile import ModelProfile
from .search import USABLE_FRACTION, search
from .stages import plan_stages

# the step's parts, as Estimate.time names them, and what the comparison calls them
TIME_PARTS = {
    "compute_and_tp": "compute (with tp collectives and pipeline sends)", "bubble": "pipeline bubble",
    "recompute": "recompute", "tp_collectives": "tp collectives", "pp_sends": "pipeline sends",
    "all_to_all": "ep all-to-alls", "cp_exchange": "cp exchange", "dp_exposed": "exposed dp traffic",
    "grad_copies": "gradient accumulation and FSDP copies",
    "optimizer": "optimizer step",
}
# plan fields the planner does not price: refused rather than priced as if absent
NOT_PRICED = {
    "split_at": "--split-at (the planner balances the cuts itself)",
    "checkpoint_overrides": "--checkpoint-module (per-module checkpoint policies)",
    "sync_bn": "--sync-bn",
}


@dataclass
class Priced:
    """A plan's price, and the search's best on the same devices (None: nothing fits, or not searched)."""

    estimate: Estimate
    gpus: int
    gpu_memory: int
    best: Estimate | None
    considered: int

    @property
    def budget(self) -> int:
        """The bytes a rank may use: the device's memory less what the allocator and CUDA keep."""
        return int(self.gpu_memory * USABLE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.estimate.memory["total"] <= self.budget

    def versus_best(self) -> str:
        """How far the plan is from the search's best, and the step's parts that differ most."""
        if self.best is None:
            return "" if self.considered == 0 else "no plan the search tried fits these devices"
        est, best = self.estimate, self.best
        if plan_fields(est.plan) == plan_fields(best.plan):
            return "this is the search's best plan"
        ratio = est.step_seconds / best.step_seconds
        fields = [k for k, v in plan_fields(best.plan).items() if plan_fields(est.plan)[k] != v]
        differ = ", ".join(f"{k} {plan_fields(est.plan)[k]} -> {plan_fields(best.plan)[k]}" for k in fields)
        if ratio <= 1:
            lead = "faster than the search's best" if self.fits else \
                f"{1 / ratio:.2f}x as fast as the search's best but it does not fit"
            return f"{lead} ({differ})"
        gaps = sorted(((est.time.get(k, 0.0) - best.time.get(k, 0.0), k) for k in TIME_PARTS), reverse=True)
        worse = ", ".join(f"{TIME_PARTS[k]} +{_ms(gap)}" for gap, k in gaps[:3] if gap > 0)
        return (f"the search's best is {ratio:.2f}x faster ({_ms(best.step_seconds)} a step against "
                f"{_ms(est.step_seconds)}; {differ}); this plan spends more on {worse or 'nothing it names'}")

    def to_dict(self) -> dict[str, Any]:
        return {"priced": self.estimate.to_dict(), "fits": self.fits, "gpus": self.gpus,
                "gpu_memory": self.gpu_memory, "usable_memory": self.budget,
                "best": self.best.to_dict() if self.best is not None else None, "versus_best": self.versus_best()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def check_priceable(plan: Plan, gpus: int | None, hw: Hardware | None = None) -> int:
    """The devices the plan takes; a plan the planner cannot price as given is refused in one line."""
    for key, flag in NOT_PRICED.items():
        if getattr(plan, key, None):
            raise GraphsplitError(f"{flag} is not priced by the planner; price the plan without it")
    if plan.fp8 is not None and hw is not None and "float8" not in hw.peak_flops:
        raise GraphsplitError(f"--fp8 needs FP8 tensor cores, and the profile of {hw.name} gives no float8 rate; "
                              "price it on h100 or h200, or drop --fp8")
    if gpus is not None and gpus != plan.world_size:
        other = f", or --dp {gpus // (plan.tp * plan.pp)} if that is the replicas meant" \
            if gpus % (plan.tp * plan.pp) == 0 else ""
        raise GraphsplitError(f"the plan runs on tp {plan.tp} x pp {plan.pp} x dp {plan.dp} = {plan.world_size} devices, "
                              f"and --gpus says {gpus}: give --gpus {plan.world_size}{other}")
    return plan.world_size


def price_plan(profile: ModelProfile, plan: Plan, hw: Hardware, gpu_memory: int, gpus: int | None = None,
               gpus_per_node: int | None = None, optimizer: str = "adamw", compare: bool = True) -> Priced:
    """`plan` priced from `profile` (fits or not); `compare`: search the same devices for the best."""
    devices = check_priceable(plan, gpus, hw)
    if plan.ep > 1 and not profile.experts:
        raise GraphsplitError(f"--ep {plan.ep}: the planner prices grouped experts (one [experts, ..] weight, as HF's "
                              "run them) and finds none in this model; experts written by hand (a loop over a list, "
                              "a weight gathered per row) are placed by the program but not priced: price the plan "
                              "without --ep")
    if plan.checkpoint_policy.kind == "attention" and not profile.has_cores:
        raise GraphsplitError(NO_CORES)
    profile.hardware = hw
    est = estimate(plan, plan_stages(profile, plan), hw, profile.batch, profile.tokens_per_sample,
                   profile.model_flops_per_sample, optimizer)
    best, considered = None, 0
    if compare:
        result = search(profile, devices, gpu_memory, hw, gpus_per_node, optimizer)
        best, considered = (result.plans[0] if result.fits else None), result.considered
    return Priced(est, devices, gpu_memory, best, considered)
