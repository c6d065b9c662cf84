"""A step's data-parallel traffic, and how much of it the program leaves exposed.

Priced as the program runs it (backends/parallelize.py, backends/local.py and torch's pipelining stage):

- DDP (ZeRO-1's too): gradients are all-reduced once a step, bucket by bucket during the last
  micro-batch's backward (the micro-batches before it under `no_sync`; torch's stage does the same under
  a pipeline): hidden behind that backward. Under a split backward (the zero-bubble schedules) they are
  averaged after the step (runtime/grad_average.py): exposed. ZeRO-1 then gathers each replica's stepped
  share after the optimizer (ZeroRedundancyOptimizer): exposed.
- FSDP with one stage (no pipeline: `LocalPipeline` runs the micro-batches, FSDP2 its own hooks): each
  block region is a unit, the rest of the stage (embeddings, head, norms) the root unit. A forward
  gathers the root unit first, before anything can run (exposed), and each region's unit ahead of it
  (prefetched: hidden behind the forward); the backward gathers the regions again (ZeRO-3, prefetched) and
  reduce-scatters each unit's gradients as its backward ends, the root unit's last, after everything
  (exposed). ZeRO-3 does all of it every micro-batch; ZeRO-2 gathers once a step, at the first
  micro-batch, and keeps the units gathered to the last backward (`keep_gathered`), its gradients still
  reduce-scattered every micro-batch.
- FSDP under a pipeline (torch's stage, `backward_maybe_with_nosync` and `perform_reduce_grad`): each
  stage's units are gathered at its first forward and kept gathered through the step (hidden behind the
  rank's first forwards), the gradients accumulated unsharded, and every unit of a stage reduce-scattered
  after that stage's last backward: on a rank with v stages the last one's (1/v of the rank's) is
  exposed, the others' behind the backwards the rank still runs (priced as at least one micro-batch's).
- Expert weights under ep are averaged over their replicas after the step (`ExpertGradAverager`):
  exposed.

Each collective is a ring over the dp replicas (`ring_seconds`); a unit's collectives are rings of their
own, with (dp - 1) latencies each.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import SPLIT_BACKWARD_SCHEDULES, Plan
from .hardware import Hardware
from .links import group_link, ring_seconds


@dataclass(frozen=True)
class DpTraffic:
    """A step's dp collectives (seconds on the dp group's link) and the part no compute hides."""

    total: float
    exposed: float


@dataclass(frozen=True)
class DpBytes:
    """What the busiest rank's dp collectives move: its fp32 gradients (the reduce's bytes), the parameters
    FSDP gathers (in the gathered dtype), the expert weights among them, and FSDP's region units with one
    stage (fp32 bytes of all of them, and how many)."""

    grads: float
    gathered: float
    experts: float
    regions: float = 0.0
    units: int = 0


def dp_traffic(plan: Plan, hw: Hardware, moved: DpBytes, forward: float, backward: float) -> DpTraffic:
    """The step's dp traffic of `plan`: `forward` and `backward` are one micro-batch's on the busiest rank
    (the windows the collectives can hide behind)."""
    dp, m = plan.dp, plan.num_microbatches
    bw, lat = group_link(hw, plan.tp * plan.pp * dp)

    def ring(nbytes: float, factor: float = 1.0, count: int = 1) -> float:
        """`count` collectives of `nbytes` in all, each a ring of its own."""
        return ring_seconds(nbytes, dp, bw, lat, factor) + factor * max(count - 1, 0) * (dp - 1) * lat \
            if nbytes > 0 else 0.0

    experts = ring_seconds(moved.experts, dp // plan.ep, bw, lat, 2) if moved.experts else 0.0
    total, exposed = experts, experts
    dense = moved.grads - moved.experts
    if dp == 1:
        return DpTraffic(total, exposed)
    if not plan.fsdp:
        reduce = ring(dense, 2)
        window = 0.0 if plan.schedule in SPLIT_BACKWARD_SCHEDULES and plan.num_stages > 1 else backward
        total, exposed = total + reduce, exposed + max(0.0, reduce - window)
        if plan.zero == 1:
            after = ring(moved.grads)
            total, exposed = total + after, exposed + after
        return DpTraffic(total, exposed)
    if plan.num_stages > 1:
        gather, reduce = ring(moved.gathered), ring(dense)
        v = plan.stages_per_rank
        exposed += max(0.0, gather - forward) + max(reduce / v, reduce - backward)
        return DpTraffic(total + gather + reduce, exposed)
    low = moved.gathered / max(dense, 1.0)  # gathered bytes per fp32 byte: 1/2 under bf16 or fp16
    root_gather, root_reduce = ring((dense - moved.regions) * low), ring(dense - moved.regions)
    region_gather = ring(moved.regions * low, count=moved.units)
    region_reduce = ring(moved.regions, count=moved.units)
    if plan.fsdp_reshards:  # ZeRO-3: every micro-batch gathers for forward and again for backward
        each = root_gather + max(0.0, region_gather - forward) + max(0.0, region_gather + region_reduce - backward) \
            + root_reduce
        return DpTraffic(total + m * (root_gather + 2 * region_gather + region_reduce + root_reduce),
                         exposed + m * each)
    once = root_gather + max(0.0, region_gather - forward)  # ZeRO-2: gathered once, kept to the last backward
    each = max(0.0, region_reduce - backward) + root_reduce
    return DpTraffic(total + root_gather + region_gather + m * (region_reduce + root_reduce),
                     exposed + once + m * each)
