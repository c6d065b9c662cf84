"""A plan's pipeline stages, priced from an `OpTable`: the sums `estimate` needs per stage.

The cut is the compiler's own: `balanced_cuts` on the same per-op costs the
pipeline_split pass computes at this micro-batch size (FLOPs + 8 x bytes moved,
8 x the bytes live across a cut), so the stages hold the parameters a transform
of the same plan would give them.

Activations kept for backward under each checkpoint policy, per stage:

- none: what every op keeps (measured per op on meta);
- blocks / every:K: each region (a run of K repeated blocks inside the stage)
  keeps its inputs: the previous block's output, and once per stage the values
  the head shares with every block (masks, rotary tables); ops before the first
  block keep what they keep; ops after a block join its region (the final norm
  and LM head), as passes/activation_checkpoint.py does;
- selective: each block keeps its inputs and the outputs of its matmul-class ops;
- stage: the stage's inputs.

With a policy, backward recomputes each region once: its full activations are
live meanwhile (the largest region's count towards the peak), and its forward
runs again (selective: only the ops whose outputs it did not keep).
"""

from __future__ import annotations

import numpy as np

from ..analysis.cost import boundary_cost
from ..passes.pipeline_split import balanced_cuts
from ..plan import Plan
from .estimate import StageSums, group_link, ring_seconds
from .hardware import Hardware
from .profile import OpTable


def cuts(table: OpTable, stages: int, b: int) -> list[int]:
    """Where stages start, as pipeline_split would cut at `b` samples per micro-batch."""
    key = ("cuts", stages, b)
    if key not in table.cache:
        n = table.n
        flops, moved = table.at(table.flops, b), table.at(table.bytes, b)
        costs = flops.astype(np.float64) + 8.0 * moved.astype(np.float64)
        comm = np.array([boundary_cost(int(x)) for x in table.at(table.live, b)])
        valid = np.zeros(n + 1, dtype=bool)
        valid[1:n] = ~table.blocked[1:n]
        table.cache[key] = balanced_cuts(costs, comm, valid, stages) if stages > 1 else []
    return table.cache[key]


def op_seconds(table: OpTable, b: int, hw: Hardware) -> np.ndarray:
    """One forward of every op at `b` samples: a roofline (FLOPs at the op's rate, bytes at the memory's)."""
    key = ("seconds", b, hw.name)
    if key not in table.cache:
        flops = table.at(table.flops, b).astype(np.float64)
        moved = table.at(table.bytes, b).astype(np.float64)
        rate = np.where(table.low_rate & table.compute, hw.flops("bfloat16"), hw.flops("float32"))
        table.cache[key] = np.maximum(flops / rate, moved / (hw.memory_bandwidth * hw.memory_efficiency))
    return table.cache[key]


def _regions(table: OpTable, a: int, e: int, per: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Checkpoint regions of stage [a, e): runs of `per` consecutive blocks, each extended over the
    non-block ops after it; and the ops before the first block (outside every region)."""
    regions: list[tuple[int, int]] = []
    outside: list[int] = []
    block = table.block
    start, count, last = None, 0, -1
    for i in range(a, e):
        bi = int(block[i])
        if bi < 0:
            if start is None:
                outside.append(i)
            continue
        if bi != last:
            if start is not None and count == per:
                regions.append((start, i))
                start, count = None, 0
            if start is None:
                start = i
            count += 1
            last = bi
    if start is not None:
        regions.append((start, e))
    # the pass checkpoints no region without FLOPs (a partial block of elementwise ops): its ops run plainly
    flops = table.flops[0] + table.flops[1]
    plain = [r for r in regions if not flops[r[0]:r[1]].any()]
    for lo, hi in plain:
        outside.extend(range(lo, hi))
    return [r for r in regions if r not in plain], outside


def _kept(table: OpTable, plan: Plan, a: int, e: int, b: int, secs: np.ndarray) -> tuple[int, int, float]:
    """(kept for backward, the largest region's activations, recompute seconds) of stage [a, e)."""
    policy = plan.checkpoint
    if policy == "none":
        return table.saved(range(a, e), b), 0, 0.0
    if policy == "stage":
        return int(table.at(table.live, b)[a]), table.saved(range(a, e), b), float(secs[a:e].sum())
    per = int(policy.split(":")[1]) if policy.startswith("every:") else 1
    selective = policy == "selective"
    regions, outside = _regions(table, a, e, per)
    live = table.at(table.live, b)
    out = table.at(table.out, b)
    kept, peak, recompute, shared = table.saved(outside, b), 0, 0.0, 0
    for lo, hi in regions:
        bi = int(table.block[lo])
        if lo == a and a > 0 and int(table.block[a - 1]) == bi:
            kept += int(live[a])  # a block cut by the stage boundary keeps what crossed it
        else:
            (stream, common) = table.block_inputs[bi]
            kept += stream[0] * b + stream[1]
            shared = max(shared, common[0] * b + common[1])
        ops = np.arange(lo, hi)
        in_blocks = table.block[lo:hi] >= 0
        if selective:
            keeps = table.compute[lo:hi] & in_blocks
            kept += int(out[lo:hi][keeps].sum()) + table.saved(ops[~in_blocks], b)
            recompute += float(secs[lo:hi][~keeps & in_blocks].sum())
            peak = max(peak, table.saved(ops[in_blocks], b))
        else:
            recompute += float(secs[lo:hi].sum())
            peak = max(peak, table.saved(ops, b))
    return kept + shared, peak, recompute


def stage_sums(table: OpTable, plan: Plan, batch: int, hw: Hardware) -> list[StageSums]:
    """Each stage of `plan` (one tp rank's share), for one micro-batch."""
    b = batch // plan.dp // plan.num_microbatches
    key = ("stages", plan.num_stages, b, plan.checkpoint, plan.tp, hw.name)
    if key in table.cache:
        return table.cache[key]
    n = table.n
    bounds = [0, *cuts(table, plan.num_stages, b), n]
    secs = op_seconds(table, b, hw)
    live = table.at(table.live, b)
    tp_bw, tp_lat = group_link(hw, plan.tp)
    out = []
    for s in range(plan.num_stages):
        a, e = bounds[s], bounds[s + 1]
        held = {name for i in range(a, e) for name in table.params[i]}
        kept, peak, recompute = _kept(table, plan, a, e, b, secs)
        tp_seconds = 0.0
        for i, _direction, kind, per_sample, const in table.collectives:
            if a <= i < e:
                factor = 2 if kind == "all_reduce" else 1
                tp_seconds += ring_seconds(per_sample * b + const, plan.tp, tp_bw, tp_lat, factor)
        last = s == plan.num_stages - 1
        output = table.output[0] * b + table.output[1] if last else 0
        out.append(StageSums(
            param_bytes=sum(table.param_bytes[name] for name in held),
            saved_bytes=kept,
            recompute_peak=peak,
            output_bytes=2 * output,  # the outputs, and the loss's buffer of their size (a log-softmax)
            send_bytes=int(live[e]) if e < n else 0,
            forward_seconds=float(secs[a:e].sum()),
            recompute_seconds=recompute,
            tp_seconds=tp_seconds,
        ))
    table.cache[key] = out
    return out
