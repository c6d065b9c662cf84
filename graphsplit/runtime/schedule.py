"""The learning-rate schedules `run` offers, as one `LambdaLR` factor of the step.

    scheduler = make_scheduler(optimizer, "cosine", warmup_steps=2, total_steps=10)
    lr_factor("cosine", 0, 2, 10)   # 0.333...: warm-up starts above zero
    lr_factor("cosine", 2, 2, 10)   # 1.0: the peak, then a half cosine down towards 0

Warm-up rises linearly as torchtitan's does, (s + 1) / (warmup + 1), so the
first step trains (a factor of 0 would waste it); after it, `cosine` and
`linear` decay from 1 towards 0 over the remaining steps, never reaching it
within the run (the last step still learns). The factor is a function of the
global step only, so a resumed run, offset by the steps it had done, gets the
lr an uninterrupted one would.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch.optim.lr_scheduler import LambdaLR

from ..errors import GraphsplitError

LR_SCHEDULES = ("constant", "cosine", "linear")


def lr_factor(schedule: str, step: int, warmup_steps: int, total_steps: int) -> float:
    """The multiplier of the base lr for 0-based optimizer step `step` of a run of `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    raise GraphsplitError(f"unknown lr schedule {schedule!r}; choose {', '.join(LR_SCHEDULES)}")


def check_schedule(schedule: str, warmup_steps: int, total_steps: int) -> None:
    """Bad settings as one line, before anything starts."""
    if schedule not in LR_SCHEDULES:
        raise GraphsplitError(f"unknown lr schedule {schedule!r}; choose {', '.join(LR_SCHEDULES)}")
    if warmup_steps < 0:
        raise GraphsplitError(f"--warmup-steps must be at least 0, got {warmup_steps}")
    if warmup_steps > total_steps:
        raise GraphsplitError(f"--warmup-steps {warmup_steps} is more than the run's {total_steps} steps; "
                              "use fewer warm-up steps or more --steps")


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int,
                   done: int = 0) -> LambdaLR:
    """A `LambdaLR` over `optimizer` for a run of `total_steps` whose first `done` steps already ran
    (a resume): call its `step()` after each optimizer step."""
    check_schedule(schedule, warmup_steps, total_steps)

    def factor(local_step: int) -> float:
        return lr_factor(schedule, done + local_step, warmup_steps, total_steps)

    return LambdaLR(optimizer, factor)


def advance(scheduler: LambdaLR) -> None:
    """`scheduler.step()` after a step, skipped or not: an fp16 overflow skips the optimizer's step
    but the schedule goes on (every rank and the reference alike), which torch warns about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        scheduler.step()
