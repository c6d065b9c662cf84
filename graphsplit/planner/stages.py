"""A plan's pipeline stages, priced from an `OpTable`: the per-stage sums `estimate` needs.

The cut is the compiler's own: `balanced_cuts` on the same per-op costs the
pipeline_split pass computes at this micro-batch size (FLOPs + 8 x bytes moved,
8 x the bytes live across a cut), so the stages hold the parameters a transform
of the same plan would give them.

What a stage keeps for backward and recomputes under each checkpoint policy: recompute.py.

What does not depend on the policy (the cut, parameters, times, sends) is computed
once per (stages, micro-batch size) and cached on the table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.balance import balanced_cuts
from ..analysis.cost import BYTES_TO_FLOPS, send_weight
from ..errors import GraphsplitError
from ..plan import SPLIT_BACKWARD_SCHEDULES, Plan
from .estimate import Stages
from .gemm_table import gemm_table
from .hardware import Hardware
from .links import group_link
from .param_reads import held, stage_of, unit_bytes
from .profile import ModelProfile, OpTable
from .recompute import policy_kept, region_spans, stage_shifts
from .rings import DROPPED


def cuts(table: OpTable, stages: int, b: int, send_flops_per_byte: float | None = None) -> list[int]:
    """Where stages start, as pipeline_split cuts at `b` samples per micro-batch, a byte sent weighing
    `send_flops_per_byte` (the plan's; analysis/cost.py's `send_weight`)."""
    key = ("cuts", stages, b, send_flops_per_byte)
    if key not in table.cache:
        n = table.n
        costs = table.at(table.flops, b).astype(np.float64) + BYTES_TO_FLOPS * table.at(table.bytes, b).astype(np.float64)
        comm = send_weight(send_flops_per_byte) * table.at(table.live, b).astype(np.float64)
        valid = np.zeros(n + 1, dtype=bool)
        valid[1:n] = ~table.blocked[1:n]
        table.cache[key] = balanced_cuts(costs, comm, valid, stages) if stages > 1 else []
    return table.cache[key]


# bytes a float8 cast moves per element of its operand, as torchao's ops run it: eagerly, `abs` and `max` for
# the amax, a copy to fp32, the scale's `mul`, the `clamp` and the float8 copy, each a kernel of its own (33
# bytes from bf16 or fp32 alike: 2 + 2 + 2 + 2 + 4 + 4 + 4 + 4 + 4 + 4 + 1 from bf16); compiled, one reduction
# reads the operand and one fused kernel reads it again and writes one byte
_EAGER_CAST_BYTES, _EAGER_CAST_KERNELS = 33, 9


def op_seconds(table: OpTable, b: int, hw: Hardware, fused: bool = False) -> np.ndarray:
    """One forward of every op at `b` samples: a roofline (FLOPs at the op's rate, bytes at the memory's)
    plus the per-op overhead. `fused`: as torch.compile runs the stage (`fused_seconds`)."""
    if fused:
        return fused_seconds(table, b, hw)
    return _op_seconds(table, b, hw, casts_fused=False)


def _op_seconds(table: OpTable, b: int, hw: Hardware, casts_fused: bool) -> np.ndarray:
    key = ("seconds", b, hw.name, casts_fused and table.float8)
    if key not in table.cache:
        flops = table.at(table.flops, b).astype(np.float64)
        moved = table.at(table.bytes, b).astype(np.float64)
        memory = hw.memory_bandwidth * hw.memory_efficiency
        rate = np.where(table.low_rate & table.compute, hw.flops("bfloat16"), hw.flops("float32"))
        rate = rate * np.where(table.low_rate, _shape_scale(table, flops, hw, "bfloat16"), 1.0)
        seconds = np.maximum(flops / rate, moved / memory) + hw.op_overhead
        if table.float8:
            # a float8 linear: its GEMM at the float8 rate, and its two operands cast first (torchao's casts,
            # ops/float8.py; `_EAGER_CAST_BYTES`). The GEMM reads its operands in float8, one byte each, and
            # writes its output
            operands = table.at(table.fp8_cast, b).astype(np.float64)
            elements = table.at(table.fp8_elems, b).astype(np.float64) if table.fp8_elems is not None \
                else operands / 2
            gemm_bytes = elements + table.at(table.out, b).astype(np.float64)
            # under --compile a ring op's casts are compiled kernels of their own (ops/float8_ring.py), priced
            # as a compiled linear's
            casts = (2 * operands + elements if casts_fused else _EAGER_CAST_BYTES * elements) / memory \
                + (2 if casts_fused else 2 * _EAGER_CAST_KERNELS) * hw.op_overhead
            fp8 = np.maximum(flops / (hw.flops("float8") * _shape_scale(table, flops, hw, "float8")), gemm_bytes / memory) \
                + casts + hw.op_overhead
            seconds = np.where(table.fp8, fp8, seconds)
        table.cache[key] = seconds
    return table.cache[key]


def _shape_scale(table: OpTable, flops: np.ndarray, hw: Hardware, dtype: str) -> np.ndarray | float:
    """Each op's factor on the profile's matmul efficiency from its GEMM's shape (gemm_table.py); 1 for
    ops that are not plain GEMMs, and everywhere when the profile has no grid."""
    grid = gemm_table(hw)
    if grid is None or table.gemm_k is None or not table.gemm_k.any():
        return 1.0
    ops = np.flatnonzero(table.gemm_k > 0)
    k, n = table.gemm_k[ops].astype(np.float64), table.gemm_n[ops].astype(np.float64)
    m = flops[ops] / np.maximum(2 * k * n, 1.0)
    found = np.ones(len(flops))
    found[ops] = grid.scale(m, k, n, dtype)
    return found


def fused_groups(table: OpTable) -> np.ndarray:
    """Each op's fused group as torch.compile (inductor) runs a stage: every maximal run of ops
    between matmul-class ops (which stay library kernels) and tp collectives is one group; a
    matmul-class op is -1. A collective is an eager op (ops/eager.py: a graph break), so inductor
    fuses nothing across it: the ops before it write what it reads, the ops after it read what it
    wrote, each a kernel of its own piece."""
    return table.pieces(at_collectives=True)


def fused_seconds(table: OpTable, b: int, hw: Hardware) -> np.ndarray:
    """`op_seconds` under torch.compile: matmul-class ops priced as eager ones; each fused group one kernel that
    reads from memory what it takes from outside the group (once per value) and writes what leaves
    it (read by an op outside the group), at the memory's rate, plus one launch. The group's time is
    shared over its ops by their unfused bytes, so stage sums, cuts and recompute read it per op."""
    key = ("fused", b, hw.name)
    found = table.cache.get(key)
    if found is not None:
        return found
    plain = _op_seconds(table, b, hw, casts_fused=True).copy()
    group = fused_groups(table)
    count = int(group.max()) + 1 if len(group) else 0
    if count == 0:
        table.cache[key] = plain
        return plain
    escapes = np.zeros(len(group), dtype=bool)  # an op whose output an op outside its group reads
    traffic = np.zeros(count)
    seen: set[tuple[int, int]] = set()
    for i, row in enumerate(table.reads):
        g = group[i]
        for vid, producer, per_sample, constant in row:
            inside = producer >= 0 and group[producer] == g and g >= 0
            if not inside and producer >= 0:
                escapes[producer] = True
            if g >= 0 and not inside and (g, vid) not in seen:
                seen.add((g, vid))
                traffic[g] += per_sample * b + constant
    out = table.at(table.out, b).astype(np.float64)
    members = group >= 0
    traffic += np.bincount(group[members & escapes], weights=out[members & escapes], minlength=count)
    flops = np.bincount(group[members], weights=table.at(table.flops, b)[members].astype(np.float64),
                        minlength=count)
    kernel = np.maximum(flops / hw.flops("float32"), traffic / (hw.memory_bandwidth * hw.memory_efficiency))
    kernel += hw.op_overhead
    moved = table.at(table.bytes, b).astype(np.float64)[members]
    total = np.bincount(group[members], weights=moved, minlength=count)
    size = np.bincount(group[members], minlength=count)
    share = np.where(total[group[members]] > 0, moved / np.maximum(total[group[members]], 1e-30),
                     1.0 / size[group[members]])
    found = plain
    found[members] = kernel[group[members]] * share
    table.cache[key] = found
    return found


def tp_op_seconds(table: OpTable, b: float, hw: Hardware, direction: str | None = None) -> np.ndarray:
    """Each op's tp collectives at `b` samples (those of `direction` only, when given), on the tp
    group's link: a ring, factor x (tp - 1) / tp of the bytes over each link, one latency per step."""
    key = ("tp_seconds", b, hw.name, direction)
    found = table.cache.get(key)
    if found is not None:
        return found
    found = np.zeros(table.n)
    tp_ops = [c for c in table.collectives if c[2] not in ("all_to_all", "cp_gather")
              and (direction is None or c[1] == direction)]
    if tp_ops and table.tp > 1:
        ops = np.array([c[0] for c in tp_ops])
        nbytes = np.array([c[3] * b + c[4] for c in tp_ops], dtype=np.float64)
        factor = np.array([2.0 if c[2] == "all_reduce" else 1.0 for c in tp_ops])
        bw, lat = group_link(hw, table.tp)
        times = factor * (table.tp - 1) / table.tp * nbytes / bw + factor * (table.tp - 1) * lat
        found = np.bincount(ops, weights=np.where(nbytes > 0, times, 0.0), minlength=table.n)
    table.cache[key] = found
    return found


def ring_op_seconds(table: OpTable, b: float, hw: Hardware, compute: np.ndarray, key: Any,
                    direction: str | None = None) -> np.ndarray:
    """`tp_op_seconds` of the program --async-tp writes (planner/rings.py's tags): a collective it makes
    a ring of tp - 1 steps, each a shard of the bytes and one latency, runs beside the matmuls of the
    chunks already held (`compute`: each op's seconds; a tag's factor: how many of its forward matmuls'
    work hides it), which hide the part of it they overlap as well as the hardware overlaps
    (`overlap_efficiency`): (tp - 1) x (step - efficiency x min(step, matmul / tp)); one a ring does
    for another (each linear's re-gather of one shard) is gone.
    `compute` all zeros: the rings exposed in full (a recompute whose matmuls were kept). `key`: what
    `compute` was made from, for the cache."""
    cache_key = ("ring_seconds", b, hw.name, direction, key)
    found = table.cache.get(cache_key)
    if found is not None:
        return found
    tp = table.tp
    found = tp_op_seconds(table, b, hw, direction).copy()
    tagged = [c for c in table.collectives if len(c) > 5 and c[5] is not None
              and (direction is None or c[1] == direction)]
    if tagged and tp > 1:
        bw, lat = group_link(hw, tp)
        for op, _, _, per_sample, constant, ring, *_ in tagged:
            plain = per_sample * b + constant
            found[op] -= (tp - 1) / tp * plain / bw + (tp - 1) * lat if plain > 0 else 0.0
            if ring == DROPPED:
                continue
            nbytes = ring[0] * b + ring[1]
            step = nbytes / tp / bw + lat
            beside = ring[3] * float(sum(compute[op + offset] for offset in ring[2])) / tp
            found[op] += (tp - 1) * (step - hw.overlap_efficiency * min(step, beside)) if nbytes > 0 else 0.0
    table.cache[cache_key] = found
    return found


def _gathered_low(plan: Plan) -> bool:
    """FSDP gathers the parameters in the low dtype: under --autocast bf16/fp16 (apply_fsdp)."""
    return plan.fsdp and plan.autocast in ("bf16", "fp16")


def as_run(table: OpTable, plan: Plan) -> OpTable:
    """`table` as `plan`'s program runs its ops: one ep rank's experts, no weight casts where FSDP
    gathers the weights already cast, and under --compile what the compiled pieces keep. (The cut is
    the compiler's, priced on the table as compiled.)"""
    table = table.for_ep(plan.ep)
    table = table.for_gathered_low() if _gathered_low(plan) else table
    table = table.for_fp8(plan.fp8, plan.async_tp) if plan.fp8 is not None else table
    return table.for_compiled() if plan.compile else table


def _split(table: OpTable, plan: Plan, b: int, hw: Hardware) -> dict[str, np.ndarray | list[int]]:
    """What the policy does not change, for `plan.num_stages` stages at `b` samples per micro-batch."""
    key = ("split", plan.num_stages, b, plan.tp, plan.ep, plan.cp, plan.pp, hw.name, plan.compile, _gathered_low(plan),
           plan.fp8, plan.send_flops_per_byte, plan.async_tp)
    if key in table.cache:
        return table.cache[key]
    n, count = table.n, plan.num_stages
    # the compiler's cut (its analysis holds every expert)
    bounds = [0, *cuts(table, count, b, plan.send_flops_per_byte), n]
    param_bytes = held(table, bounds, 1, plan.ep)
    expert_bytes = held(table, bounds, 1, plan.ep, only_experts=True)
    run = as_run(table, plan)  # its ops' seconds and collectives as the plan's program runs them
    secs = op_seconds(run, b, hw, plan.compile)
    prefix = np.concatenate([[0.0], np.cumsum(secs)])
    forward = prefix[bounds[1:]] - prefix[bounds[:-1]]
    per_op = ring_op_seconds(run, b, hw, secs, (plan.compile, _gathered_low(plan), plan.fp8)) if plan.async_tp \
        else tp_op_seconds(run, b, hw)
    tp_seconds = np.bincount(stage_of(bounds, np.arange(n)), weights=per_op, minlength=count) if per_op.any() \
        else np.zeros(count)
    a2a_seconds = np.zeros(count)
    exchanges = [c for c in table.collectives if c[2] == "all_to_all"]
    if exchanges and plan.ep > 1:
        ops = np.array([c[0] for c in exchanges])
        nbytes = np.array([c[3] * b + c[4] for c in exchanges], dtype=np.float64)
        # the ep group: ep consecutive dp ranks, tp * pp apart in the (dp, pp, tp) mesh. A balanced routing
        # sends (ep - 1) / ep of the rows away, each pair of ranks one message (ep - 1 latencies)
        bw, lat = group_link(hw, plan.tp * plan.pp * plan.ep)
        times = (plan.ep - 1) / plan.ep * nbytes / bw + (plan.ep - 1) * lat
        a2a_seconds = np.bincount(stage_of(bounds, ops), weights=np.where(nbytes > 0, times, 0.0), minlength=count)
    cp_seconds, gathered = np.zeros(count), np.zeros(n)
    attention = [c for c in table.collectives if c[2] == "cp_gather"]
    if attention and plan.cp > 1:
        ops = np.array([c[0] for c in attention])
        # the whole sequence's keys and values of the cp group's samples (b is one rank's share: b x cp of them)
        whole = np.array([c[3] * b * plan.cp + c[4] for c in attention], dtype=np.float64)
        # the cp group: cp consecutive dp ranks, tp * pp apart; a ring all-gather forward (and in each
        # recompute, priced with the forward), a reduce-scatter backward: (cp - 1) / cp of it over each link
        bw, lat = group_link(hw, plan.tp * plan.pp * plan.cp)
        times = (plan.cp - 1) / plan.cp * whole / bw + (plan.cp - 1) * lat
        cp_seconds = np.bincount(stage_of(bounds, ops), weights=np.where(whole > 0, times, 0.0), minlength=count)
        for op, w in [(c[0], w) for c, w in zip(attention, whole) if c[1] == "forward"]:  # the gathered keys and values attention keeps for backward, beyond its shard
            gathered[op] = (plan.cp - 1) / plan.cp * w
    live = table.at(table.live, b)
    send = np.array([int(live[e]) if e < n else 0 for e in bounds[1:]], dtype=np.int64)
    found = {"bounds": bounds, "param_bytes": param_bytes, "forward": forward, "tp": tp_seconds, "send": send,
             "expert_bytes": expert_bytes, "a2a": a2a_seconds, "cp": cp_seconds, "gathered": gathered}
    table.cache[key] = found
    return found


def _forward_tp_seconds(table: OpTable, b: float, hw: Hardware, fused: bool, rings: str | None) -> np.ndarray:
    """Each op's forward tp collectives as a recompute runs them again: `rings` (--async-tp) "hidden"
    where the region recomputes the matmuls beside them, "exposed" where it kept their outputs."""
    if rings is None:
        return tp_op_seconds(table, b, hw, "forward")
    compute = op_seconds(table, b, hw, fused) if rings == "hidden" else np.zeros(table.n)
    return ring_op_seconds(table, b, hw, compute, ("recompute", fused, rings), "forward")


def _recompute_seconds(table: OpTable, b: float, hw: Hardware, fused: bool, rings: str | None = None) -> np.ndarray:
    """What recomputing each op costs: its forward, and its forward tp collectives, which a
    checkpointed region runs again in backward (report/summary.py lists them as "recompute")."""
    key = ("recompute_seconds", b, hw.name, fused, rings)
    found = table.cache.get(key)
    if found is None:
        found = table.cache[key] = op_seconds(table, b, hw, fused) + _forward_tp_seconds(table, b, hw, fused, rings)
    return found


def _stage_kept(table: OpTable, policy: str, bounds: list[int], b: int, hw: Hardware, fused: bool = False,
                early_stop: bool = True, rings: bool = False) -> tuple[np.ndarray, ...]:
    """`policy_kept` of every stage of `bounds` as arrays, each shape priced once (a deep model's middle
    stages are the same ops): kept, peak, recompute, the tp collectives among the recompute's, and what
    the regions keep once recomputed."""
    # plans that differ only where this does not look (dp, FSDP, schedule) share their stages: priced once
    # --async-tp: a selective region keeps its matmuls' outputs, so its recomputed rings run alone
    ring_mode = None if not rings else "exposed" if policy.startswith("selective") else "hidden"
    whole = ("stage_kept", policy, tuple(bounds), b, hw.name, fused, early_stop, ring_mode)
    cached = table.cache.get(whole)
    if cached is not None:
        return cached
    edges = np.asarray(bounds, dtype=np.int64)
    shift = stage_shifts(table, edges)
    shapes, which = np.unique((edges[:-1] - shift) * (table.n + 1) + edges[1:] - shift, return_inverse=True)
    found = []
    for code in shapes.tolist():
        a, e = divmod(code, table.n + 1)
        key = ("kept", policy, a, e, b, hw.name, fused, early_stop, ring_mode)
        kept = table.cache.get(key)
        if kept is None:
            comm = _forward_tp_seconds(table, b, hw, fused, ring_mode)
            kept = table.cache[key] = policy_kept(table, policy, a, e, b,
                                                  _recompute_seconds(table, b, hw, fused, ring_mode), comm, early_stop)
        found.append(kept)
    saved, peak, recompute, recomputed, again = (np.array([k[i] for k in found]) for i in range(5))
    cached = table.cache[whole] = (saved[which].astype(np.int64), peak[which].astype(np.int64),
                                   recompute[which].astype(np.float64), again[which].astype(np.float64),
                                   recomputed[which].astype(np.int64))
    return cached


def stage_sums(table: OpTable, plan: Plan, batch: int, hw: Hardware) -> Stages:
    """Each stage of `plan` (one tp rank's share), for one micro-batch."""
    replicas = plan.sample_replicas
    samples = batch // replicas // plan.num_microbatches
    if samples < 1:
        who = f"dp={plan.dp} replicas" if plan.cp == 1 else f"{replicas} sample replicas (dp={plan.dp}, cp={plan.cp})"
        raise GraphsplitError(f"{plan.num_microbatches} micro-batches per replica but each of {who} has "
                              f"{batch // replicas} sample(s) of the batch of {batch}; give fewer micro-batches")
    # context parallelism: each rank runs 1/cp of every sample's tokens, and 1/cp of its attention (its
    # queries over the whole sequence): priced as 1/cp of a sample
    b: float = samples / plan.cp if plan.cp > 1 else samples
    key = ("stages", plan.num_stages, b, plan.checkpoint, plan.tp, plan.dp if plan.fsdp else 1, plan.ep, plan.cp,
           plan.pp, hw.name, plan.compile, plan.schedule in SPLIT_BACKWARD_SCHEDULES, plan.fsdp_reshards, plan.fp8,
           plan.send_flops_per_byte, plan.async_tp)
    if key in table.cache:
        return table.cache[key]
    split = _split(table, plan, b, hw)
    bounds = split["bounds"]
    saved, peak, recompute, recompute_tp, recomputed = _stage_kept(
        as_run(table, plan), plan.checkpoint, bounds, b, hw, plan.compile,
        early_stop=plan.schedule not in SPLIT_BACKWARD_SCHEDULES, rings=plan.async_tp)
    gathered = split["gathered"]
    if gathered.any():  # the gathered keys and values: kept for backward, or live while a region recomputes
        per_stage = np.array([gathered[a:e].sum() for a, e in zip(bounds[:-1], bounds[1:])])
        if plan.checkpoint_policy.kind in ("none", "selective"):
            saved = saved + per_stage.astype(np.int64)
        else:
            peak = peak + np.array([gathered[a:e].max() for a, e in zip(bounds[:-1], bounds[1:])]).astype(np.int64)
    output = int(table.output[0] * b + table.output[1])
    units = _fsdp_units(table, plan) if plan.block_regions else None
    found = Stages(
        param_bytes=split["param_bytes"],
        kept_param_bytes=held(table, bounds, plan.dp, plan.ep) if plan.fsdp else split["param_bytes"],
        saved_bytes=saved,
        recompute_peak=peak,
        send_bytes=split["send"],
        forward_seconds=split["forward"],
        recompute_seconds=recompute,
        recompute_tp_seconds=recompute_tp,
        recomputed_bytes=recomputed,
        tp_seconds=split["tp"],
        output_bytes=2 * output,  # the outputs, and the loss's buffer of their size (a log-softmax)
        expert_param_bytes=split["expert_bytes"],
        a2a_seconds=split["a2a"],
        cp_seconds=split["cp"] if plan.cp > 1 else None,
        fsdp_units=units,
    )
    table.cache[key] = found
    return found


def _fsdp_units(table: OpTable, plan: Plan) -> np.ndarray:
    """FSDP's units of their own, gathered one or two at a time (ZeRO-3, one stage): the largest's bytes,
    all of theirs and how many, as `Stages.fsdp_units`. They follow from the checkpoint policy alone
    (every plan reaching here shards per region), so each policy's are found once per table."""
    # (no checkpointing: each block a region run plainly, an FSDP unit all the same)
    policy = "blocks" if plan.checkpoint == "none" else plan.checkpoint
    key = ("fsdp_units", policy)
    found = table.cache.get(key)
    if found is None:
        sizes = unit_bytes(table, plan, region_spans(table, policy, 0, table.n))
        found = table.cache[key] = np.array([[sizes.max(initial=0), sizes.sum(), np.count_nonzero(sizes)]],
                                            dtype=np.int64)
    return found


def plan_stages(profile: ModelProfile, plan: Plan) -> Stages:
    """`plan`'s stages priced from `profile` (on the hardware the search set on it)."""
    return stage_sums(profile.table(plan), plan, profile.batch, profile.hardware)
