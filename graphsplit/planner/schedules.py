"""What a pipeline schedule costs: activations in flight per rank, and the bubble.

The counts follow torch.distributed.pipelining's own schedules (the ones `run`
drives), so the memory model holds what the runtime holds:

- GPipe runs every micro-batch's forward before any backward: all `m` in flight.
- 1F1B: rank r starts its first backward after pp - r forwards, and then holds
  that many (fewer when m is smaller).
- Interleaved 1F1B (v stages per rank): torch's `_get_warmup_ops` gives rank r
  (v - 1) * (m / rounds) + 2 * (pp - 1 - r) warm-up forwards of one stage-chunk
  each, then one more before the first backward; each chunk holds 1/v of the
  rank's layers.
- LoopedBFS runs all forwards of each local stage before any backward: m * v chunks.

The bubble is the idle fraction of the step: (pp - 1) / (m + pp - 1) for GPipe
and 1F1B; interleaving divides the fill and drain by v (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters", sec. 2.2.2).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def in_flight_chunks(schedule: str, pp: int, microbatches: int, stages_per_rank: int, rank: int) -> int:
    """Stage-chunks (one local stage x one micro-batch) whose activations rank `rank` holds at its peak."""
    m, v = microbatches, stages_per_rank
    if pp == 1:
        return v  # one micro-batch at a time through every local stage
    if schedule == "gpipe":
        return m * v
    if schedule == "1f1b":
        return min(pp - rank, m) * v
    if schedule == "interleaved-1f1b":
        rounds = max(1, m // pp)
        per_round = m // rounds
        warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
        return min(warmup + 1, m * v)
    if schedule == "looped-bfs":
        return m * v
    raise ValueError(f"unknown schedule {schedule!r}")


@functools.cache
def in_flight(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> np.ndarray:
    """`in_flight_chunks` of every rank, as an array indexed by pp rank (read-only: it is cached)."""
    found = np.array([in_flight_chunks(schedule, pp, microbatches, stages_per_rank, r) for r in range(pp)],
                     dtype=np.int64)
    found.flags.writeable = False
    return found


def bubble_fraction(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> float:
    """The fraction of a step each rank spends idle waiting for the pipeline to fill and drain."""
    if pp == 1:
        return 0.0
    fill = (pp - 1) / (stages_per_rank if schedule in ("interleaved-1f1b", "looped-bfs") else 1)
    return fill / (microbatches + fill)


def underfilled_note(plan: Any) -> str | None:
    """What a user should know when the batch gives fewer micro-batches than pipeline stages."""
    m, stages = plan.num_microbatches, plan.num_stages
    if plan.pp == 1 or m >= stages:
        return None
    bubble = bubble_fraction(plan.schedule, plan.pp, m, plan.stages_per_rank)
    return (f"the batch gives {m} micro-batch{'es' if m > 1 else ''} for {stages} pipeline stages: at most {m} "
            f"{'stages work' if m > 1 else 'stage works'} at a time (bubble {bubble:.0%}); a batch of {stages} or "
            "more per replica fills the pipeline")
