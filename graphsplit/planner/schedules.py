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

A rank's activations at its peak are the bytes of the chunks it holds then, each its own stage's
(`held_activations`: a stage with the embedding or the head keeps more than one of blocks alone; the
peak of interleaved 1F1B in closed form, the others walked in torch's order).

The bubble is the idle fraction of the step: (pp - 1) / (m + pp - 1) for GPipe
and 1F1B; interleaving divides the fill and drain by v (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters", sec. 2.2.2).

The zero-bubble schedules (zero-bubble = torch's interleaved ZB-1P, zbv, dualpipev)
split each backward into an input-gradient part I and a weight-gradient part W run
later; their closed forms (Qi et al. 2024, "Zero Bubble Pipeline Parallelism",
arXiv 2401.10241: ZB-H1 leaves (pp - 1)(F + I - W), ZB-V none when F = I = W;
DeepSeek-V3's DualPipe table: (PP/2 - 1)(F&B + B - 3W)) hold only at their ideal
micro-batch counts, so both counts are read from torch's own action order instead
(`rank_actions`: the schedule class built on stand-in stages, as every rank builds
it): activations in flight are the peak of forwards whose weight gradient has not
run yet (an I keeps what W will read); the bubble is that order timed with the ZB
paper's unit costs, F = I = W = 1 per whole stage (a full backward B = I + W = 2),
each action waiting for its neighbours' (`simulated_bubble`).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

# torch's action orders are used for these (the closed forms above are for the others)
ORDERED_SCHEDULES = ("zero-bubble", "zbv", "dualpipev")
# the ZB paper's unit costs of one whole stage's forward, input backward and weight backward
UNIT_COST = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}


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
    if schedule in ORDERED_SCHEDULES:
        return _peak_held(rank_actions(schedule, pp, m, v)[rank])
    raise ValueError(f"unknown schedule {schedule!r}")


def held_activations(schedule: str, pp: int, microbatches: int, stages_per_rank: int,
                     saved: np.ndarray) -> np.ndarray:
    """Per pp rank, the most bytes of activations it holds at once, `saved[s]` being what one micro-batch
    keeps on stage s: each forward adds its chunk's bytes and each backward (a weight backward under a
    split backward) gives them back, in the order the schedule runs them. Where a rank's chunks differ
    (a stage with the embedding or the head, a cut inside a block) this is not its count of chunks in
    flight times its largest chunk: interleaving holds about as many micro-batches of each chunk."""
    key = (schedule, pp, microbatches, stages_per_rank, saved.tobytes())
    found = _HELD.get(key)
    if found is None:
        if len(_HELD) > 100_000:  # plans of one search share their stages' bytes; a new search starts afresh
            _HELD.clear()
        found = _HELD[key] = _held(schedule, pp, microbatches, stages_per_rank, saved)
        found.flags.writeable = False
    return found


_HELD: dict[tuple[Any, ...], np.ndarray] = {}


def _held(schedule: str, pp: int, microbatches: int, stages_per_rank: int, saved: np.ndarray) -> np.ndarray:
    v, m = stages_per_rank, microbatches
    if pp == 1:
        return np.array([int(saved.sum())], dtype=np.int64)  # one micro-batch through every local stage
    if v == 1 and schedule not in ORDERED_SCHEDULES:
        return in_flight(schedule, pp, m, 1) * saved
    if schedule == "looped-bfs":
        return m * saved.reshape(v, pp).sum(axis=0)
    if schedule == "interleaved-1f1b":
        return _interleaved_held(pp, m, v, saved.reshape(v, pp).T)
    stage, sign = _split_backward_order(schedule, pp, m, v)
    return np.maximum(np.cumsum(saved[stage] * sign, axis=1).max(axis=1), 0)


def _interleaved_held(pp: int, m: int, v: int, s: np.ndarray) -> np.ndarray:
    """`held_activations` of interleaved 1F1B, `s[r, c]` being what rank r's local stage c keeps, in
    closed form (the search prices plans up to pp and m in the thousands). torch's order
    (`_get_1f1b_rank_ops`): W warm-up forwards, then step i runs forward W + i and backward i, then
    the remaining backwards; forward k runs local stage (k // P) % v, backward j stage v - 1 - (j // P)
    % v, P micro-batches a round. After step i's forward a rank holds g(i) = F(W + i + 1) - B(i),
    F and B the bytes of the first forwards and backwards; g is periodic in i with period P * v (a
    period adds and gives back every stage P times) and linear between the steps where either stage
    changes, so its peak is at one of those steps (`_interleaved_steps`)."""
    rows, per, fwd, bwd, warm, steady = _interleaved_steps(pp, m, v)
    total = s.sum(axis=1)[:, None]
    before = np.concatenate([np.zeros((pp, 1), dtype=s.dtype), np.cumsum(s, axis=1)], axis=1)
    reverse = np.concatenate([np.zeros((pp, 1), dtype=s.dtype), np.cumsum(s[:, ::-1], axis=1)], axis=1)

    def taken(prefix: np.ndarray, order: np.ndarray, at: tuple[np.ndarray, ...]) -> np.ndarray:
        cycles, stage, rest = at  # bytes of the first k actions: whole cycles, whole rounds, a part round
        return per * (cycles * total + prefix[rows, stage]) + rest * order[rows, stage]

    held = taken(before, s, fwd) - taken(reverse, s[:, ::-1], bwd)
    held = np.where(steady, held, 0).max(axis=1)
    return np.maximum(held, taken(before, s, warm)[:, 0]).astype(np.int64)


@functools.cache
def _interleaved_steps(pp: int, m: int, v: int) -> tuple[Any, ...]:
    """The steps `_interleaved_held` reads for (pp, m, v), as (whole cycles, local stage, part of a
    round) of the forwards and backwards before each: the step 0, the last of the first period, and
    where either stage changes."""
    rounds = max(1, m // pp)
    per = m // rounds
    ranks = np.arange(pp)
    warmup = np.minimum((v - 1) * per + 2 * (pp - 1 - ranks), m * v)[:, None]
    steady = m * v - warmup  # steps with a forward and a backward
    last = np.minimum(per * v, steady) - 1
    turns = np.arange(v + 1)[None, :] * per
    steps = np.concatenate([np.zeros((pp, 1), dtype=np.int64), last, np.broadcast_to(turns, (pp, v + 1)),
                            (-(warmup + 1)) % per + turns], axis=1)
    steps = np.clip(steps, 0, np.maximum(last, 0))

    def split(k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = k // per
        return q // v, q % v, k % per

    return ranks[:, None], per, split(warmup + steps + 1), split(steps), split(warmup), steady > 0


@functools.cache
def _split_backward_order(schedule: str, pp: int, microbatches: int,
                          stages_per_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """`held_activations`' order for the schedules read from torch (`rank_actions`): per pp rank, the
    stage of each action that takes (+1) or gives back (-1) a chunk's activations, padded with 0."""
    takes = {"F": 1, "W": -1, "B": -1}
    rows = [[(stage, takes[kind]) for kind, stage, _ in actions if kind in takes]
            for actions in rank_actions(schedule, pp, microbatches, stages_per_rank)]
    width = max(len(r) for r in rows)
    stage = np.zeros((pp, width), dtype=np.int64)
    sign = np.zeros((pp, width), dtype=np.int64)
    for r, row in enumerate(rows):
        stage[r, :len(row)] = [s for s, _ in row]
        sign[r, :len(row)] = [t for _, t in row]
    stage.flags.writeable = sign.flags.writeable = False
    return stage, sign


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
    if schedule in ORDERED_SCHEDULES:
        return simulated_bubble(schedule, pp, microbatches, stages_per_rank)
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


Action = tuple[str, int, int]  # (F, I, W or B; stage index; micro-batch)


@functools.cache
def rank_actions(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> tuple[tuple[Action, ...], ...]:
    """Each pp rank's compute actions in the order torch's schedule runs them (idle slots left out;
    an overlapped forward-backward pair as its two parts): the schedule class built on stand-in
    stages, which its constructor reads only for their places."""
    import torch.distributed.pipelining as pipelining

    from ..plan import SCHEDULES

    cls = getattr(pipelining, SCHEDULES[schedule])
    stages = [types.SimpleNamespace(group_size=pp, group_rank=0, num_stages=pp * stages_per_rank, stage_index=i,
                                    is_first=i == 0, is_last=i == pp * stages_per_rank - 1, submod=None,
                                    has_backward=True, stage_index_to_group_rank={})
              for i in range(stages_per_rank)]
    order = cls(stages, n_microbatches=microbatches, loss_fn=lambda out, target: out).pipeline_order
    def flat(action: Any) -> list[Action]:
        if action is None:
            return []
        if action.sub_actions:
            return [a for sub in action.sub_actions for a in flat(sub)]
        return [(action.computation_type.value, action.stage_index, action.microbatch_index)]

    return tuple(tuple(a for action in order[r] for a in flat(action)) for r in range(pp))


def last_stage_in_flight(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> int:
    """Micro-batches whose last-stage output (and loss) are held at once, on the rank holding it."""
    if pp == 1:
        return 1
    if schedule not in ORDERED_SCHEDULES:
        return in_flight_chunks(schedule, pp, microbatches, 1, pp - 1)
    last = pp * stages_per_rank - 1
    return max(_peak_held(tuple(a for a in actions if a[1] == last))
               for actions in rank_actions(schedule, pp, microbatches, stages_per_rank))


def _peak_held(actions: tuple[Action, ...]) -> int:
    """The most stage-chunks a rank holds activations for: a forward takes one, a weight gradient
    (or a full backward) gives it back; an input gradient keeps what its weight gradient reads."""
    held = peak = 0
    for kind, _, _ in actions:
        held += 1 if kind == "F" else -1 if kind in ("W", "B") else 0
        peak = max(peak, held)
    return peak


@functools.cache
def awaiting_weights(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> np.ndarray:
    """Per pp rank, the most stage-chunks whose input gradient has run and weight gradient not yet:
    a checkpointed chunk keeps its recomputed activations that long (ops/activation_checkpoint.py's
    `_RecomputeOnce`). Zero for the schedules without a split backward."""
    found = np.zeros(pp, dtype=np.int64)
    if schedule in ORDERED_SCHEDULES and pp > 1:
        for rank, actions in enumerate(rank_actions(schedule, pp, microbatches, stages_per_rank)):
            waiting = peak = 0
            for kind, _, _ in actions:
                waiting += 1 if kind == "I" else -1 if kind == "W" else 0
                peak = max(peak, waiting)
            found[rank] = peak
    found.flags.writeable = False
    return found


@functools.cache
def simulated_bubble(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> float:
    """The idle fraction of torch's action order for `schedule`, timed with UNIT_COST: each rank runs
    its actions in order; a forward waits for the previous stage's forward of its micro-batch, an input
    (or full) backward for the next stage's and its own forward, a weight backward for its input one."""
    orders = rank_actions(schedule, pp, microbatches, stages_per_rank)
    num_stages = pp * stages_per_rank
    cost = {k: c / stages_per_rank for k, c in UNIT_COST.items()}
    done: dict[tuple[str, int, int], float] = {}  # (F or I, stage, micro-batch) -> when it finished
    clock = [0.0] * pp
    nxt = [0] * pp
    while any(nxt[r] < len(orders[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while nxt[r] < len(orders[r]):
                kind, stage, mb = orders[r][nxt[r]]
                if kind == "F":
                    needs = [("F", stage - 1, mb)] if stage > 0 else []
                elif kind in ("I", "B"):
                    needs = [("F", stage, mb)] + ([("I", stage + 1, mb)] if stage < num_stages - 1 else [])
                else:
                    needs = [("I", stage, mb)]
                if any(n not in done for n in needs):
                    break
                start = max([clock[r], *(done[n] for n in needs)])
                clock[r] = start + cost[kind]
                done[("I" if kind == "B" else kind, stage, mb)] = clock[r]
                nxt[r] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"torch's {schedule} order deadlocks in the simulation (pp={pp}, m={microbatches})")
    busy = microbatches * sum(UNIT_COST[k] for k in "FIW")
    return 1.0 - busy / max(clock)
