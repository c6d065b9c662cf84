"""Price a given plan (`graphsplit plan ... --tp 2 --pp 2`, `graphsplit.price`): exactly as the search
prices that candidate, fits or not, beside the search's best and what makes the difference."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import graphsplit
from graphsplit import GraphsplitError, Plan
from graphsplit.planner import load_hardware
from graphsplit.planner.estimate import plan_fields, stage_sends
from graphsplit.planner.price import price_plan
from graphsplit.planner.profile import profile_model
from graphsplit.planner.search import search

from .conftest import EXAMPLES
from .test_cli import cli

H100 = load_hardware("h100")
MEMORY = 80 * 2**30


@pytest.fixture(scope="module")
def gpt():
    loaded = graphsplit.loader.load_model(str(EXAMPLES / "gpt.py"))
    profile = profile_model(loaded, (1, 2))
    profile.hardware = H100  # as plan_model sets it: the search prices on it
    return loaded, profile


def test_a_given_plan_is_priced_as_the_search_prices_that_candidate(gpt):
    _, profile = gpt
    result = search(profile, 8, MEMORY, H100)
    for found in result.plans[:8]:
        priced = price_plan(profile, found.plan, H100, MEMORY, 8, compare=False)
        assert priced.estimate.step_seconds == found.step_seconds
        assert priced.estimate.memory == found.memory
        assert priced.fits


def test_the_best_plan_says_so_and_a_slower_one_names_the_parts_it_spends_more_on(gpt):
    _, profile = gpt
    best = search(profile, 8, MEMORY, H100).plans[0]
    assert price_plan(profile, best.plan, H100, MEMORY, 8).versus_best() == "this is the search's best plan"
    slow = price_plan(profile, Plan(tp=2, pp=2, dp=2), H100, MEMORY, 8)
    assert plan_fields(slow.best.plan) == plan_fields(best.plan)
    ratio = slow.estimate.step_seconds / best.step_seconds
    assert ratio > 1
    text = slow.versus_best()
    assert f"{ratio:.2f}x faster" in text and "tp 2 -> " in text and "pipeline bubble +" in text
    # the step's parts: the bubble of 1F1B over 2 stages and 2 micro-batches, sends between them
    assert slow.estimate.time["bubble"] > 0 and slow.estimate.time["pp_sends"] > 0


def test_a_v_schedules_turn_sends_nothing_and_the_last_stage_sends_nothing():
    """Interleaved over 2 ranks, stages 0-2 each send to a stage on the other rank; a V schedule puts
    stages 1 and 2 on rank 1, which torch runs one after the other without a transfer."""
    sent = np.array([1.0, 2.0, 3.0, 4.0])  # bytes each stage sends a micro-batch
    interleaved = stage_sends(Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2), sent, 1.0, 0.5)
    assert interleaved.tolist() == [3.0, 5.0, 7.0, 0.0]  # out and the gradient back, each a latency
    for schedule in ("zbv", "dualpipev"):
        assert stage_sends(Plan(pp=2, schedule=schedule, stages_per_rank=2), sent, 1.0, 0.5).tolist() == \
            [3.0, 0.0, 7.0, 0.0]
    assert not stage_sends(Plan(), np.array([5.0]), 1.0, 0.5).any()


def test_a_plan_that_does_not_fit_is_still_priced(gpt):
    _, profile = gpt
    small = 512 * 2**10
    priced = price_plan(profile, Plan(dp=8), H100, small, 8)
    assert not priced.fits and priced.estimate.memory["total"] > priced.budget
    assert priced.estimate.step_seconds > 0
    assert priced.best is None or priced.best.memory["total"] <= priced.budget


def test_price_from_python_needs_no_planner_internals():
    priced = graphsplit.price(str(EXAMPLES / "gpt.py"), Plan(tp=2, pp=2, dp=2), "h100", "80GiB")
    assert priced.fits and priced.gpus == 8
    record = priced.to_dict()
    assert record["priced"]["plan"]["tp"] == 2 and record["best"] is not None and record["versus_best"]


def test_a_module_in_memory_is_priced_as_its_model_file():
    """`price(module, plan, example_inputs=...)`: a model already built, read on meta without copying a
    weight, priced exactly as the same model's file."""
    sys.path.insert(0, str(EXAMPLES))
    import gpt  # noqa: PLC0415

    plan = Plan(tp=2, pp=2, dp=2)
    module = gpt.build_model()
    from_file = graphsplit.price(str(EXAMPLES / "gpt.py"), plan, "h100", "80GiB", compare=False)
    in_memory = graphsplit.price(module, plan, "h100", "80GiB", compare=False, example_inputs=gpt.example_inputs(),
                                 loss_fn=gpt.loss_fn, example_target=gpt.example_target())
    assert in_memory.estimate.step_seconds == pytest.approx(from_file.estimate.step_seconds, rel=1e-9)
    assert in_memory.estimate.memory == from_file.estimate.memory
    assert all(p.device.type == "cpu" for p in module.parameters())  # the module itself untouched
    with pytest.raises(graphsplit.GraphsplitError, match="needs example_inputs="):
        graphsplit.price(module, plan, "h100")


def test_plan_command_prices_the_flags_given():
    r = cli("plan", EXAMPLES / "gpt.py", "--gpus", "8", "--tp", "2", "--pp", "2")
    assert r.returncode == 0, r.stderr
    assert "tp2 pp2 dp2" in r.stdout  # dp: what the devices leave
    assert "fits in" in r.stdout and "the search's best" in r.stdout
    j = cli("plan", EXAMPLES / "gpt.py", "--gpus", "8", "--tp", "2", "--pp", "2", "--json")
    assert j.returncode == 0, j.stderr
    record = json.loads(j.stdout)
    assert record["priced"]["plan"]["dp"] == 2 and record["fits"] is True
    assert set(record["priced"]["time"]) >= {"compute_and_tp", "bubble", "tp_collectives", "pp_sends", "dp_exposed"}


@pytest.mark.parametrize("args, message", [
    (["--gpus", "6", "--tp", "2", "--pp", "2", "--dp", "2"], "= 8 devices, and --gpus says 6"),
    (["--gpus", "4", "--pp", "2", "--split-at", "h.1"], "--split-at (the planner balances the cuts itself) is not priced"),
    (["--gpus", "8", "--tp", "2", "--out", "x.json"], "drop it when pricing a given plan"),
])
def test_a_plan_that_cannot_be_priced_is_refused_in_one_line(args, message):
    r = cli("plan", EXAMPLES / "gpt.py", *args)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_plan_the_model_cannot_take_is_refused_in_one_line():
    with pytest.raises(GraphsplitError, match="heads cannot be split over tp=8"):
        graphsplit.price(str(EXAMPLES / "gpt.py"), Plan(tp=8), "h100")


def test_zero2_is_priced_holding_its_gathered_parameters_and_gathering_once_a_step(gpt):
    _, profile = gpt
    zero3 = price_plan(profile, Plan(dp=8, fsdp=True), H100, MEMORY, 8, compare=False).estimate
    zero2 = price_plan(profile, Plan(dp=8, fsdp=True, zero=2), H100, MEMORY, 8, compare=False).estimate
    # ZeRO-3 holds about two blocks gathered at a time; ZeRO-2 the whole stage from forward to backward
    assert zero2.memory["communication_buffers"] > zero3.memory["communication_buffers"]
    # ZeRO-3 gathers each block again for its backward, with a ring's latencies per unit
    assert zero2.time["dp_collectives"] < zero3.time["dp_collectives"]
    plans = search(profile, 8, MEMORY, H100).plans
    tried = [e.plan for e in plans if e.plan.zero == 2]
    assert tried and all(p.num_stages == 1 and p.fsdp for p in tried)  # only where it differs from ZeRO-3


def test_zero1_is_priced_with_a_dp_th_of_the_optimizer_states_and_a_gather_after_the_step(gpt):
    _, profile = gpt
    ddp = price_plan(profile, Plan(dp=8), H100, MEMORY, 8, compare=False).estimate
    zero1 = price_plan(profile, Plan(dp=8, zero=1), H100, MEMORY, 8, compare=False).estimate
    assert zero1.memory["optimizer_state"] == ddp.memory["optimizer_state"] // 8
    assert zero1.memory["parameters"] == ddp.memory["parameters"] and zero1.memory["gradients"] == ddp.memory["gradients"]
    assert zero1.time["dp_exposed"] > ddp.time["dp_exposed"]  # the replicas' shares gathered after the step
    assert zero1.time["optimizer"] < ddp.time["optimizer"]
    assert any(e.plan.zero == 1 and not e.plan.fsdp for e in search(profile, 8, MEMORY, H100).plans)


def test_fp8_is_priced_from_the_float8_rate_and_the_casts(gpt):
    """--fp8 runs the GPT example's 17 linears in float8: at Llama-like widths that is faster, at this toy's
    width (64) the casts cost more than the GEMMs save; each linear's own time is its GEMM at the float8
    rate and its operands cast (eagerly: torchao's six kernels, 33 bytes an element; compiled: two passes);
    where the profile has no float8 rate, one line."""
    from graphsplit.planner.stages import as_run, op_seconds

    loaded, profile = gpt
    plan = Plan(tp=2, dp=4, autocast="bf16")
    bf16 = price_plan(profile, plan, H100, MEMORY, 8, compare=False).estimate
    fp8 = price_plan(profile, plan.replace(fp8="tensorwise"), H100, MEMORY, 8, compare=False).estimate
    assert fp8.step_seconds != bf16.step_seconds and fp8.memory == bf16.memory
    table = profile.table(plan)
    plain = op_seconds(as_run(table, plan), 8, H100)
    cast = op_seconds(as_run(table, plan.replace(fp8="rowwise")), 8, H100)
    assert table.fp8.sum() == 17 and (cast[~table.fp8] == plain[~table.fp8]).all()
    fused = op_seconds(as_run(table, plan.replace(fp8="rowwise")), 8, H100, fused=True)
    assert (fused[table.fp8] < cast[table.fp8]).all()  # the casts fused: measured 2.5x faster on an H200
    # a linear 4096 x 4096 on 8,192 tokens: its GEMM at twice bf16's rate, the casts at the memory's
    flops, operands = 2 * 8192 * 4096 * 4096, 2 * (8192 * 4096 + 4096 * 4096)
    gemm_bf16, gemm_fp8 = flops / H100.flops("bfloat16"), flops / H100.flops("float8")
    casts = 2.5 * operands / (H100.memory_bandwidth * H100.memory_efficiency)
    assert gemm_fp8 + casts < gemm_bf16  # where FP8 pays: large linears
    with pytest.raises(GraphsplitError, match="float8"):
        price_plan(profile, plan.replace(fp8="tensorwise"), load_hardware("a100"), MEMORY, 8, compare=False)
