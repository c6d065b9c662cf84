"""One plan's memory per rank and step time, from the per-stage sums of the model's profile.

Memory per rank, in the sources' five parts plus communication buffers:

- parameters: fp32 (the optimizer's master copy; autocast casts inside the graph);
  FSDP keeps 1/dp of them.
- gradients: fp32, one per parameter; FSDP keeps 1/dp of them.
- optimizer state: AdamW's two fp32 moments (1/dp of them under FSDP); SGD none.
- activations: the bytes one stage-chunk keeps for backward under the plan's
  checkpoint policy, times the chunks the schedule keeps in flight on that rank
  (schedules.py); with checkpointing, the largest region's recompute on top.
- outputs and loss: the last stage's outputs of the micro-batches in flight, and the
  loss's own buffers (a cross-entropy keeps its log-softmax).
- expert weights under expert parallelism (ep): one ep rank's experts (E / ep of them).
- communication buffers: DDP's gradient buckets, the pipeline's send/receive buffers;
  FSDP (as graphsplit applies it: a `fully_shard` unit per block region, checkpointed or with one
  stage run plainly, and one per stage for the rest, one per stage under a split backward; driven by torch.distributed.pipelining,
  which keeps every unit unsharded from its first backward to the step's last) gathers the
  rank's parameters and accumulates their gradients unsharded until the last micro-batch's
  backward reduce-scatters them; with one stage and no pipeline a region's unit is resharded
  after its forward and its gradients reduce-scattered after its backward (the stage's other
  parameters and two regions' held at once, the regions gathered twice); under --autocast
  bf16/fp16 it gathers them in that dtype and accumulates the gradients in fp32 (its reduce
  dtype), and a matmul keeps the gathered weight for backward, not a cast copy per micro-batch
  (`OpTable.for_gathered_low`).

Step time: each stage's forward, backward (twice the forward: two matmuls per
matmul) and recompute, every op priced by a roofline against the hardware
(FLOPs at the matmul or the vector rate, bytes at the memory bandwidth); the tp
collectives of a micro-batch on the tp group's link; the pipeline's sends; the
schedule's bubble; expert parallelism's all-to-alls (each micro-batch's routed rows out and back,
forward and backward, not overlapped); context parallelism's key/value all-gathers and reduce-scatters
(not overlapped; a cp rank runs 1/cp of each sample and keeps the gathered keys and values); the dp
traffic (DDP's all-reduce, FSDP's gathers and reduce-scatters, ZeRO-1's gather after the step) on the dp
group's link, the part no compute hides as the program runs it (dp_traffic.py); what the gradients and
FSDP's gathers move through memory beside the ops (accumulation over micro-batches, DDP's bucket copies,
FSDP2's copy-out and copy-in: grad_traffic.py); and the optimizer's pass over its state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..plan import V_SCHEDULES, Plan
from .dp_traffic import DpBytes, dp_traffic
from .grad_traffic import grad_traffic_bytes
from .hardware import Hardware
from .links import group_link
from .schedules import (
    awaiting_weights,
    bubble_fraction,
    held_activations,
    last_stage_in_flight,
)

FP32 = 4
ADAMW_STATES = 2  # exp_avg, exp_avg_sq


@dataclass(frozen=True)
class Stages:
    """A plan's pipeline stages on one tp rank, for one micro-batch of the plan's size: arrays by stage."""

    param_bytes: np.ndarray  # fp32 parameters it holds (a tied copy counts on every stage holding it)
    kept_param_bytes: np.ndarray  # what it keeps of them between steps: all, or FSDP's first dp shard
    saved_bytes: np.ndarray  # kept for backward by one forward under the plan's checkpoint policy
    recompute_peak: np.ndarray  # the largest checkpoint region's activations, live while it is recomputed
    send_bytes: np.ndarray  # what it sends to the next stage (activations; their gradients come back)
    forward_seconds: np.ndarray  # one forward
    recompute_seconds: np.ndarray  # what backward recomputes, its forward tp collectives included
    tp_seconds: np.ndarray  # its tp collectives, forward and backward
    output_bytes: int  # the last stage's outputs and the loss's buffers
    # expert parallelism: the expert weights among param_bytes (one ep rank's experts), and the
    # all-to-alls of one micro-batch's routed rows, forward and backward
    expert_param_bytes: np.ndarray | None = None
    a2a_seconds: np.ndarray | None = None
    # context parallelism: each stage's key/value all-gathers (forward) and reduce-scatters (backward)
    cp_seconds: np.ndarray | None = None
    # the forward tp collectives a checkpointed region runs again in backward (among recompute_seconds)
    recompute_tp_seconds: np.ndarray | None = None
    # what a chunk's checkpointed regions keep once recomputed (all they save, as without the policy):
    # under a split-backward schedule, from its input gradient to its weight gradient
    recomputed_bytes: np.ndarray | None = None
    # FSDP with one stage and a unit per block region (Plan.fsdp_per_region): per stage, the largest
    # region's parameter bytes, all regions' together, and how many regions are units
    fsdp_units: np.ndarray | None = None


@dataclass
class Estimate:
    """What one plan costs, for its busiest rank."""

    plan: Plan
    memory: dict[str, int]  # parameters, gradients, optimizer_state, activations, outputs_and_loss,
    #                         communication_buffers, total
    step_seconds: float
    samples_per_second: float
    tokens_per_second: float | None
    mfu: float
    bubble: float
    time: dict[str, float] = field(default_factory=dict)  # seconds per step by kind
    busiest_rank: int = 0
    per_rank: dict[str, np.ndarray] = field(default_factory=dict)  # each memory part, by pp rank

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": plan_fields(self.plan),
            "memory": dict(self.memory),
            "step_seconds": self.step_seconds,
            "samples_per_second": self.samples_per_second,
            "tokens_per_second": self.tokens_per_second,
            "mfu": self.mfu,
            "bubble": self.bubble,
            "time": dict(self.time),
            "busiest_pp_rank": self.busiest_rank,
        }


def plan_fields(plan: Plan) -> dict[str, Any]:
    return {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep, "cp": plan.cp, "fsdp": plan.fsdp,
            "zero": (plan.zero or 3) if plan.fsdp else plan.zero, "microbatches": plan.num_microbatches,
            "schedule": plan.schedule, "stages_per_rank": plan.stages_per_rank, "checkpoint": plan.checkpoint,
            "autocast": plan.autocast, "compile": plan.compile, "sequence_parallel": plan.sequence_parallel,
            "async_tp": plan.async_tp, "send_flops_per_byte": plan.send_flops_per_byte}


@dataclass
class Memory:
    """A plan's memory by pp rank, and what its step time reads of it (`estimate`)."""

    parts: dict[str, np.ndarray]  # each part, by pp rank
    total: int  # the busiest rank's
    busiest: int
    params: np.ndarray  # the parameters each rank holds (fp32, whole)
    by_expert: np.ndarray  # of which expert weights under ep
    sharded: np.ndarray  # of which FSDP shards (the rest)
    gathered: np.ndarray  # what FSDP gathers of them (in the low dtype under autocast)


def _by_rank(plan: Plan, values: np.ndarray, how: str) -> np.ndarray:
    """Stage s lies on pp rank s % pp (a V: rank r also holds stage 2 * pp - 1 - r): fold the
    stages of each rank together."""
    grid = values.reshape(plan.stages_per_rank, plan.pp)
    if plan.schedule in V_SCHEDULES:
        grid = np.stack([grid[0], grid[1][::-1]])
    return grid.sum(axis=0) if how == "sum" else grid.max(axis=0)


def stage_sends(plan: Plan, send_bytes: np.ndarray, bandwidth: float, latency: float) -> np.ndarray:
    """Each stage's send to the next a micro-batch and the gradient coming back, in seconds; none from the
    last stage, nor where the next lies on the same rank (a V schedule's turn: torch runs it locally)."""
    if plan.pp == 1:
        return np.zeros(plan.num_stages)
    crosses = np.array([s < plan.num_stages - 1 and plan.stage_rank(s) != plan.stage_rank(s + 1)
                        for s in range(plan.num_stages)])
    return np.where(crosses, (send_bytes / bandwidth + latency) * 2, 0.0)


def plan_memory(plan: Plan, st: Stages, optimizer: str = "adamw") -> Memory:
    """Memory of each pp rank of `plan`, whose stages are `st`: the search reads this first and prices the
    step time only of the plans that fit (or that need the least memory, when none does)."""
    m, v, pp, dp = plan.num_microbatches, plan.stages_per_rank, plan.pp, plan.dp

    def by_rank(values: np.ndarray, how: str) -> np.ndarray:
        return _by_rank(plan, values, how)

    params = by_rank(st.param_bytes, "sum")
    acts = held_activations(plan.schedule, pp, m, v, st.saved_bytes) + by_rank(st.recompute_peak, "max")
    if st.recomputed_bytes is not None:
        # a split-backward schedule keeps a chunk's recomputed activations until its weight gradient
        acts = acts + awaiting_weights(plan.schedule, pp, m, v) * by_rank(st.recomputed_bytes, "max")
    outputs = np.zeros(pp, dtype=np.int64)
    outputs[plan.stage_rank(plan.num_stages - 1)] = st.output_bytes * last_stage_in_flight(plan.schedule, pp, m, v)
    states = ADAMW_STATES if optimizer == "adamw" else 0
    kept = by_rank(st.kept_param_bytes, "sum")  # FSDP: the first dp rank's shards, the largest
    # ZeRO-1: each dp replica holds the states of its share of the parameters (ZeroRedundancyOptimizer)
    shares = dp if plan.zero == 1 else 1
    parts = {"parameters": kept, "gradients": kept, "optimizer_state": states * kept // shares}
    buffers = 2 * by_rank(st.send_bytes, "max") if pp > 1 else np.zeros(pp, dtype=np.int64)
    # expert weights under ep are never gathered (each ep rank holds its experts whole) nor seen by DDP
    by_expert = by_rank(st.expert_param_bytes, "sum") if plan.ep > 1 and st.expert_param_bytes is not None \
        else np.zeros(pp, dtype=np.int64)
    sharded = params - by_expert
    if plan.ddp:
        # DDP's buckets are a second copy of every gradient it averages, allocated when DDP wraps the stage
        # and held from then on (`gradient_as_bucket_view=False`, torch's default, which apply_ddp keeps:
        # as views, gradients zeroed to None and accumulated fresh under no_sync would still sit beside the
        # buckets at the peak, and the pipelined API's swap of `.grad` would alias a later step's buckets)
        buffers = buffers + sharded
    # FSDP under --autocast bf16/fp16 gathers parameters in that dtype (apply_fsdp's MixedPrecisionPolicy):
    # the gathered copies and the unsharded gradients computed on them are half the fp32 bytes
    low = plan.fsdp and plan.autocast in ("bf16", "fp16")
    gathered = sharded // 2 if low else sharded
    if plan.fsdp:  # the gathered parameters and the unsharded gradients, from the first backward to the last
        # FSDP2 accumulates a low-dtype gradient across micro-batches in its reduce dtype, fp32
        # (FSDPParam.to_accumulated_grad_if_needed), each stage's backward first making its own in the
        # low dtype: with more than one micro-batch, fp32 gradients plus one stage's low-dtype ones
        accumulating = low and m > 1
        grads_held = sharded + by_rank(st.param_bytes, "max") // 2 if accumulating else gathered
        if plan.fsdp_reshards and st.fsdp_units is not None:
            # a unit per region, resharded after its forward and gathered again for its backward, the next
            # one's gathered ahead; its gradients reduce-scattered after its backward: the stage's other
            # parameters and two regions' at once (apply_fsdp)
            largest, regions, _ = st.fsdp_units[0]
            held = np.maximum(sharded - regions, 0) + min(2 * int(largest), int(regions))
            grads_held = held // 2 if low else held
            buffers = buffers + 2 * grads_held
        elif pp > 1:
            # torch's pipeline stage runs every backward without gradient sync and reduce-scatters a stage
            # after its last one (`perform_reduce_grad`): the unsharded gradients, accumulated from each
            # stage's first backward (in fp32 under a low param dtype), are what the activations' peak
            # holds beside them; the sharded ones are made from them once the stage's activations are gone
            # (and a stage's low-dtype gradients, as a backward makes them before adding them in)
            parts["gradients"] = sharded
            buffers = buffers + gathered + (by_rank(st.param_bytes, "max") // 2 if low else 0)
        else:
            buffers = buffers + gathered + grads_held
    parts.update(activations=acts, outputs_and_loss=outputs, communication_buffers=buffers)
    total = sum(parts.values())
    busiest = int(np.argmax(total))
    return Memory(parts, int(total[busiest]), busiest, params, by_expert, sharded, gathered)


def estimate(plan: Plan, st: Stages, hw: Hardware, samples: int, tokens_per_sample: int | None,
             model_flops_per_sample: float, optimizer: str = "adamw", memory: Memory | None = None) -> Estimate:
    """Memory of the busiest rank and the step time of `plan`, whose stages are `st` (`memory`: its
    `plan_memory`, where the caller has it already).

    `samples`: the global batch; `model_flops_per_sample`: the untouched model's forward FLOPs for one
    sample (MFU counts forward + backward, 3x, and no recompute, as the sources do)."""
    m, v, pp, tp, dp = plan.num_microbatches, plan.stages_per_rank, plan.pp, plan.tp, plan.dp
    # the mesh is (dp, pp, tp), tp fastest: tp groups are contiguous, pp neighbours tp apart, dp replicas tp*pp apart
    pp_bw, pp_lat = group_link(hw, tp * 2) if pp > 1 else (1.0, 0.0)
    share = max(1.0, plan.world_size / hw.shared_cores) if hw.shared_cores else 1.0  # CPU ranks sharing cores

    def by_rank(values: np.ndarray, how: str) -> np.ndarray:
        return _by_rank(plan, values, how)

    mem = memory if memory is not None else plan_memory(plan, st, optimizer)
    params, by_expert, gathered = mem.params, mem.by_expert, mem.gathered
    memory_of = {k: int(val[mem.busiest]) for k, val in mem.parts.items()}
    memory_of["total"] = mem.total
    per_rank = dict(mem.parts)  # arrays: the search prices thousands of plans and reads few of them

    sends = stage_sends(plan, st.send_bytes, pp_bw, pp_lat)
    a2a = st.a2a_seconds if st.a2a_seconds is not None else 0.0
    exchange = st.cp_seconds if st.cp_seconds is not None else 0.0
    recompute = st.recompute_seconds
    recompute_tp = st.recompute_tp_seconds if st.recompute_tp_seconds is not None else np.zeros_like(st.tp_seconds)
    stage_time = (3 * st.forward_seconds + recompute - recompute_tp) * share + recompute_tp + st.tp_seconds \
        + sends + a2a + exchange
    per_mb = by_rank(stage_time, "sum")
    bottleneck = float(per_mb.max())
    bubble = bubble_fraction(plan.schedule, pp, m, v)
    pipeline = bottleneck * m / (1 - bubble) if bubble < 1 else float("inf")
    grads = float(params.max())
    busiest = int(np.argmax(per_mb))
    forward = float(by_rank(st.forward_seconds * share, "sum")[busiest])
    units = st.fsdp_units[0] if st.fsdp_units is not None else (0, 0, 0)
    moved = DpBytes(grads, float(gathered.max()), float(by_expert.max()), float(units[1]), int(units[2]))
    traffic = dp_traffic(plan, hw, moved, forward, bottleneck - forward)
    # gradient accumulation, DDP's bucket copies and FSDP's copy-out and copy-in, on the compute stream
    grad_copies = grad_traffic_bytes(plan, moved) / (hw.memory_bandwidth * hw.memory_efficiency) * share
    dp_comm, exposed_dp = traffic.total, traffic.exposed
    opt_bytes = grads * (7 if optimizer == "adamw" else 3) / (dp if plan.fsdp or plan.zero == 1 else 1)
    optimizer_seconds = opt_bytes / (hw.memory_bandwidth * hw.memory_efficiency) * share
    step = pipeline + exposed_dp + grad_copies + optimizer_seconds
    model_flops = 3 * model_flops_per_sample * samples
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(plan.autocast or "", "float32")
    peak = hw.peak_flops.get(dtype, hw.peak_flops["float32"])
    mfu = model_flops / (step * plan.world_size * peak) if step > 0 else 0.0
    comm_tp = float(by_rank(st.tp_seconds + recompute_tp, "sum")[0]) * m
    # the bottleneck rank's recompute over the step (its forward ops and tp collectives run again)
    recompute_step = float(by_rank((recompute - recompute_tp) * share + recompute_tp, "sum")[int(np.argmax(per_mb))]) * m
    # the bottleneck rank's sends and receives over the step (inside compute_and_tp, not beside it: torch's
    # runtime schedules could keep them in flight, bench/pp_send_overlap.py, which no run on GPUs has measured)
    comm_pp = float(by_rank(sends, "sum")[busiest]) * m if pp > 1 else 0.0
    comm_a2a = float(by_rank(st.a2a_seconds, "sum").max()) * m if st.a2a_seconds is not None else 0.0
    comm_cp = float(by_rank(st.cp_seconds, "sum").max()) * m if st.cp_seconds is not None else 0.0
    return Estimate(
        plan=plan,
        memory=memory_of,
        step_seconds=step,
        samples_per_second=samples / step if step > 0 else 0.0,
        tokens_per_second=samples * tokens_per_sample / step if tokens_per_sample and step > 0 else None,
        mfu=mfu,
        bubble=bubble,
        time={"compute_and_tp": pipeline * (1 - bubble), "bubble": pipeline * bubble, "tp_collectives": comm_tp,
              "pp_sends": comm_pp, "recompute": recompute_step, "all_to_all": comm_a2a, "cp_exchange": comm_cp,
              "dp_exposed": exposed_dp, "dp_collectives": dp_comm, "grad_copies": grad_copies,
              "optimizer": optimizer_seconds},
        busiest_rank=mem.busiest,
        per_rank=per_rank,
    )
