"""Pipeline sends in flight: how much of them torch's runtime schedules could hide, timed on their own order.

    python bench/pp_send_overlap.py

torch.distributed.pipelining runs interleaved 1F1B (and the zero-bubble schedules) on its
`_PipelineScheduleRuntime`: a send is posted and not waited for until the step ends, a receive is posted
when the sender's compute is scheduled (`_add_send_recv`) and waited for by the compute that reads it.
This times each rank's actions in that order (`pipeline_order_with_comms`, built on stand-in stages as
every rank builds it), a forward costing 1/v, a backward 2/v (one stage of v a rank), each transfer tau,
taken as in flight from the moment its data exists and both ends have posted it. It prints the step's
growth in units of tau beside about what the planner prices: each micro-batch's two transfers per stage on the
step's path, the bubble stretching them with the rest (2 (m v + pp - 1) tau; torch's Schedule1F1B waits
for them so). Whether NCCL runs a rank's transfers in
flight so, or queues them on one stream in the order they were posted, is not measured here (no run on
more than one GPU): the planner keeps pricing the sends on the step's path.

The other bound: ProcessGroupNCCL issues the operations of a `batch_isend_irecv` (torch's `_batch_p2p`)
on the process group's own communicator, one stream a device, where each runs once the one posted before
it has finished. `one_stream_step_time` times that: a rank's sends and receives in posted order on one
stream, each starting once the previous one ends and the compute posted before it has run, a pair
finishing tau after both ends have started; a receive posted early (as soon as its sender's compute is
scheduled) then holds back every send posted after it.
"""

from __future__ import annotations

import types

import torch.distributed.pipelining as pipelining
from torch.distributed.pipelining.schedules import _ComputationType as Kind


def order(pp: int, m: int, v: int) -> tuple[dict[int, list], dict[int, int]]:
    stages = [types.SimpleNamespace(group_size=pp, group_rank=0, num_stages=pp * v, stage_index=i, is_first=i == 0,
                                    is_last=i == pp * v - 1, submod=None, has_backward=True,
                                    stage_index_to_group_rank={}) for i in range(v)]
    schedule = pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=lambda out, target: out)
    return schedule.pipeline_order_with_comms, schedule.stage_index_to_group_rank


def step_time(pp: int, m: int, v: int, tau: float) -> float:
    """When the last rank finishes, each transfer in flight from when its data and both ends are ready."""
    actions, rank_of = order(pp, m, v)
    last = pp * v - 1
    clock, at = [0.0] * pp, [0] * pp
    done: dict[tuple[str, int, int], float] = {}  # (F or B, stage, micro-batch) -> its compute's end
    posted: dict[tuple[str, int, int], float] = {}  # (F or B, receiving stage, micro-batch) -> the recv's post

    def arrived(kind: str, stage: int, mb: int) -> float | None:
        source = (kind, stage - 1 if kind == "F" else stage + 1, mb)
        if source not in done or (kind, stage, mb) not in posted:
            return None
        return max(done[source], posted[(kind, stage, mb)]) + tau

    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while at[r] < len(actions[r]):
                a = actions[r][at[r]]
                kind, stage, mb = a.computation_type, a.stage_index, a.microbatch_index
                if kind in (Kind.RECV_F, Kind.RECV_B):
                    posted[("F" if kind == Kind.RECV_F else "B", stage, mb)] = clock[r]
                elif kind in (Kind.FORWARD, Kind.FULL_BACKWARD):
                    f = kind == Kind.FORWARD
                    t = clock[r] if f else max(clock[r], done[("F", stage, mb)])
                    neighbour = stage - 1 if f else stage + 1
                    if (f and stage > 0) or (not f and stage < last):
                        if rank_of[neighbour] == r:  # the same rank: no transfer
                            if ("F" if f else "B", neighbour, mb) not in done:
                                break
                            t = max(t, done[("F" if f else "B", neighbour, mb)])
                        else:
                            ready = arrived("F" if f else "B", stage, mb)
                            if ready is None:
                                break
                            t = max(t, ready)
                    clock[r] = t + (1 if f else 2) / v
                    done[("F" if f else "B", stage, mb)] = clock[r]
                at[r] += 1
                moved = True
    return max(clock)


def _p2p_key(action) -> tuple[tuple[str, int, int, int], str]:
    """A send or receive as the transfer it takes part in (direction, from stage, to stage, micro-batch)
    and its side."""
    kind, stage, mb = action.computation_type, action.stage_index, action.microbatch_index
    if kind == Kind.SEND_F:
        return ("F", stage, stage + 1, mb), "send"
    if kind == Kind.RECV_F:
        return ("F", stage - 1, stage, mb), "recv"
    if kind == Kind.SEND_B:
        return ("B", stage, stage - 1, mb), "send"
    return ("B", stage + 1, stage, mb), "recv"


def one_stream_step_time(pp: int, m: int, v: int, tau: float) -> float:
    """When the last rank finishes, each rank's sends and receives run one after another in posted order."""
    actions, rank_of = order(pp, m, v)
    last = pp * v - 1
    compute: dict[int, list] = {r: [] for r in range(pp)}
    comms: dict[int, list] = {r: [] for r in range(pp)}  # (action, index of the compute posted before it)
    for r in range(pp):
        for a in actions[r]:
            if a.computation_type in (Kind.FORWARD, Kind.FULL_BACKWARD):
                compute[r].append(a)
            elif a.computation_type in (Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B):
                comms[r].append((a, len(compute[r]) - 1))
    ends: dict[int, list[float]] = {r: [] for r in range(pp)}
    clock, stream = [0.0] * pp, [0.0] * pp
    at_compute, at_comm = [0] * pp, [0] * pp
    started: dict[tuple, float] = {}  # (transfer, side) -> when that side's operation started on its stream
    finished: dict[tuple, float] = {}  # transfer -> when it finished
    done: dict[tuple[str, int, int], float] = {}
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while at_comm[r] < len(comms[r]):
                a, before = comms[r][at_comm[r]]
                if before >= len(ends[r]):
                    break  # the compute posted before it is not timed yet
                key, side = _p2p_key(a)
                started[key, side] = max(stream[r], ends[r][before] if before >= 0 else 0.0)
                other = (key, "recv" if side == "send" else "send")
                if other not in started:
                    break  # its peer has not reached it on its own stream
                finished[key] = max(started[key, side], started[other]) + tau
                stream[r] = finished[key]
                at_comm[r] += 1
                moved = True
            while at_compute[r] < len(compute[r]):
                a = compute[r][at_compute[r]]
                f = a.computation_type == Kind.FORWARD
                stage, mb = a.stage_index, a.microbatch_index
                t = clock[r] if f else max(clock[r], done.get(("F", stage, mb), float("inf")))
                neighbour = stage - 1 if f else stage + 1
                if (f and stage > 0) or (not f and stage < last):
                    if rank_of[neighbour] == r:
                        t = max(t, done.get(("F" if f else "B", neighbour, mb), float("inf")))
                    else:
                        key = ("F", neighbour, stage, mb) if f else ("B", neighbour, stage, mb)
                        t = max(t, finished.get(key, float("inf")))
                if t == float("inf"):
                    break
                clock[r] = t + (1 if f else 2) / v
                done["F" if f else "B", stage, mb] = clock[r]
                ends[r].append(clock[r])
                at_compute[r] += 1
                moved = True
    if any(at_compute[r] < len(compute[r]) or at_comm[r] < len(comms[r]) for r in range(pp)):
        raise RuntimeError("the posted order deadlocks on one stream")
    return max(clock + stream)


def main() -> None:
    taus = (0.05, 0.2, 0.5, 1.0)
    print(f"{'pp':>3} {'m':>4} {'v':>2}  {'no sends':>9}  {'growth in flight (x tau)':>26}  {'priced (x tau)':>14}  "
          f"{'one stream, tau 0':>17}  {'growth on one stream (x tau)':>30}")
    for pp, m, v in ((4, 8, 2), (8, 16, 4), (16, 32, 4), (16, 16, 8)):
        base = step_time(pp, m, v, 0.0)
        growth = [(step_time(pp, m, v, t / v) - base) / (t / v) for t in taus]
        stream0 = one_stream_step_time(pp, m, v, 0.0)
        queued = [(one_stream_step_time(pp, m, v, t / v) - stream0) / (t / v) for t in taus]
        print(f"{pp:>3} {m:>4} {v:>2}  {base:9.2f}  {' '.join(f'{g:6.0f}' for g in growth):>26}  "
              f"{2 * (m * v + pp - 1):>14}  {stream0:17.2f}  {' '.join(f'{g:7.0f}' for g in queued):>30}")
    print("(growth for a transfer of 0.05, 0.2, 0.5 and 1 stage-forwards; 2 (pp v - 1) is one micro-batch's chain; "
          "on one stream, over its own step at tau 0)")


if __name__ == "__main__":
    main()
