"""planner/dp_traffic.py: a step's dp traffic and its exposed part, as the program runs each kind of plan
(which collectives run when is tested on the program itself in tests/test_fsdp.py)."""

from __future__ import annotations

import math

import graphsplit
from graphsplit import Plan
from graphsplit.planner import load_hardware
from graphsplit.planner.dp_traffic import DpBytes, dp_traffic
from graphsplit.planner.links import group_link, ring_seconds
from graphsplit.planner.price import price_plan
from graphsplit.planner.profile import profile_model

from .conftest import EXAMPLES

H100 = load_hardware("h100")
GRADS = 4e9  # fp32 gradient bytes of the rank (1B parameters)
REGIONS = 3e9  # of which in the blocks' units
MOVED = DpBytes(grads=GRADS, gathered=GRADS / 2, experts=0.0, regions=REGIONS, units=8)  # bf16 gathers
LONG = 1e3  # a compute window no collective outlasts


def ring(plan: Plan, nbytes: float, factor: float = 1.0, count: int = 1) -> float:
    bw, lat = group_link(H100, plan.tp * plan.pp * plan.dp)
    return ring_seconds(nbytes, plan.dp, bw, lat, factor) + factor * (count - 1) * (plan.dp - 1) * lat


def test_zero3_with_one_stage_moves_and_exposes_everything_again_every_micro_batch():
    one, two = (dp_traffic(Plan(dp=64, fsdp=True, microbatches=m), H100, MOVED, 0.05, 0.1) for m in (1, 2))
    assert math.isclose(two.total, 2 * one.total) and math.isclose(two.exposed, 2 * one.exposed)
    plan = Plan(dp=64, fsdp=True)
    # a micro-batch: the root unit gathered and reduce-scattered once, the regions gathered twice
    expected = ring(plan, (GRADS - REGIONS) / 2) + ring(plan, GRADS - REGIONS) \
        + 2 * ring(plan, REGIONS / 2, count=8) + ring(plan, REGIONS, count=8)
    assert math.isclose(one.total, expected)


def test_the_root_units_gather_and_reduce_scatter_are_exposed_behind_any_compute():
    """Nothing runs before the stage's first unit is gathered, nor after its gradients are the last
    reduced: with compute windows longer than any collective, they alone are exposed."""
    plan = Plan(dp=64, fsdp=True)
    found = dp_traffic(plan, H100, MOVED, LONG, LONG)
    assert math.isclose(found.exposed, ring(plan, (GRADS - REGIONS) / 2) + ring(plan, GRADS - REGIONS))
    # with no compute to hide behind, all of it
    assert math.isclose(dp_traffic(plan, H100, MOVED, 0.0, 0.0).exposed, found.total)


def test_zero2_gathers_once_a_step_and_reduce_scatters_every_micro_batch():
    one, two = (dp_traffic(Plan(dp=64, fsdp=True, zero=2, microbatches=m), H100, MOVED, LONG, LONG)
                for m in (1, 2))
    plan = Plan(dp=64, fsdp=True, zero=2)
    reduce = ring(plan, GRADS - REGIONS) + ring(plan, REGIONS, count=8)
    assert math.isclose(two.total - one.total, reduce)
    assert math.isclose(two.exposed - one.exposed, ring(plan, GRADS - REGIONS))  # the root unit's, after each backward
    zero3 = dp_traffic(Plan(dp=64, fsdp=True, microbatches=2), H100, MOVED, LONG, LONG)
    assert two.total < zero3.total


def test_under_a_pipeline_a_ranks_last_stage_reduce_scatters_after_its_last_backward():
    """torch's stage reduces a stage's gradients after its last backward: with one stage a rank (1F1B)
    all of them exposed, however long the compute; with v stages a rank, the last one's 1/v."""
    moved = DpBytes(grads=GRADS, gathered=GRADS / 2, experts=0.0)
    single = Plan(dp=16, pp=4, fsdp=True, microbatches=8)
    found = dp_traffic(single, H100, moved, LONG, LONG)
    reduce = ring(single, GRADS)
    assert math.isclose(found.exposed, reduce)
    assert math.isclose(found.total, reduce + ring(single, GRADS / 2))
    interleaved = Plan(dp=16, pp=4, fsdp=True, microbatches=8, schedule="interleaved-1f1b", stages_per_rank=2)
    assert math.isclose(dp_traffic(interleaved, H100, moved, LONG, LONG).exposed, reduce / 2)


def test_ddp_hides_its_all_reduce_behind_the_last_backward_but_not_after_a_split_backward():
    moved = DpBytes(grads=GRADS, gathered=GRADS, experts=0.0)
    ddp = Plan(dp=16, pp=2, microbatches=4)
    found = dp_traffic(ddp, H100, moved, 0.1, LONG)
    assert found.exposed == 0 and math.isclose(found.total, ring(ddp, GRADS, 2))
    split = Plan(dp=16, pp=2, microbatches=4, schedule="zbv", stages_per_rank=2)
    after = dp_traffic(split, H100, moved, 0.1, LONG)  # averaged after the step (runtime/grad_average.py)
    assert math.isclose(after.exposed, after.total)
    plan = Plan(dp=16, zero=1)
    zero1 = dp_traffic(plan, H100, moved, 0.1, LONG)  # its gather after the optimizer
    assert math.isclose(zero1.exposed, ring(plan, GRADS))


def test_the_planner_prices_zero3_traffic_per_micro_batch_on_a_real_profile():
    loaded = graphsplit.loader.load_model(str(EXAMPLES / "llama.py"))
    profile = profile_model(loaded, (1,))
    one, two = (price_plan(profile, Plan(dp=4, fsdp=True, microbatches=m), H100, 80 * 2**30, compare=False).estimate
                for m in (1, 2))
    assert math.isclose(two.time["dp_collectives"], 2 * one.time["dp_collectives"])
    zero2 = price_plan(profile, Plan(dp=4, fsdp=True, zero=2, microbatches=2), H100, 80 * 2**30,
                       compare=False).estimate
    assert one.time["dp_collectives"] < zero2.time["dp_collectives"] < two.time["dp_collectives"]
