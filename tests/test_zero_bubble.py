"""Zero-bubble schedules (zero-bubble, zbv, dualpipev): V placement, what a plan they cannot drive is
told, the planner's counts read from torch's own action order, and parity with the untouched model.

The local backend splits each backward as torch's stage does (`stage_backward_input`, then
`stage_backward_weight`), so these parity checks run the functions the real schedules run; the real
processes (gloo, torchrun) run zbv on gpt in tests/test_distributed.py.
"""

import pytest

import graphsplit.passes.stage_programs as program_module
from graphsplit import Plan
from graphsplit.cli import plan_from
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.ops.activation_checkpoint import CheckpointRegion
from graphsplit.planner.schedules import (
    bubble_fraction,
    in_flight_chunks,
    last_stage_in_flight,
    rank_actions,
)

from .conftest import EXAMPLES, MODELS


def test_v_placement_puts_first_and_last_stage_on_rank_zero():
    plan = Plan(pp=3, schedule="zbv", stages_per_rank=2)
    assert [plan.stage_rank(s) for s in range(6)] == [0, 1, 2, 2, 1, 0]
    assert plan.stages_of_rank(1) == [1, 4]
    # the loop placement of the interleaved zero-bubble schedule stays as interleaved-1f1b's
    assert Plan(pp=2, schedule="zero-bubble", stages_per_rank=2).stages_of_rank(0) == [0, 2]


def test_the_cli_gives_the_multi_stage_schedules_two_stages_per_rank():
    for schedule in ("zero-bubble", "zbv", "dualpipev"):
        plan, _ = plan_from({"pp": 2, "schedule": schedule})  # flags not given are left out
        assert plan.stages_per_rank == 2 and plan.num_stages == 4


@pytest.mark.parametrize("kwargs, says", [
    ({"pp": 2, "schedule": "zbv", "stages_per_rank": 3}, "exactly 2 stages on each rank"),
    ({"pp": 2, "schedule": "dualpipev", "stages_per_rank": 2, "microbatches": 3}, "at least one micro-batch per stage"),
    ({"pp": 2, "schedule": "zero-bubble", "stages_per_rank": 2, "microbatches": 5}, "divisible by them, got 5"),
])
def test_plans_a_zero_bubble_schedule_cannot_drive_are_refused_with_the_reason(kwargs, says):
    with pytest.raises(GraphsplitError, match=says):
        Plan(**kwargs)


def test_the_planner_reads_torchs_action_order():
    # every stage-chunk is run forward, input-backward and weight-backward once, on its own rank
    for schedule in ("zero-bubble", "zbv", "dualpipev"):
        orders = rank_actions(schedule, 2, 4, 2)
        plan = Plan(pp=2, schedule=schedule, stages_per_rank=2, microbatches=4)
        for rank, actions in enumerate(orders):
            assert {a[1] for a in actions} == set(plan.stages_of_rank(rank))
            done = {(kind, stage, mb) for kind, stage, mb in actions}
            for stage in plan.stages_of_rank(rank):
                for mb in range(4):
                    assert ("F", stage, mb) in done
                    assert ("B", stage, mb) in done or {("I", stage, mb), ("W", stage, mb)} <= done
    # ZB-V keeps 1F1B's activation memory (Qi et al. 2024, sec. 6): pp micro-batches of a whole rank,
    # 2 * pp chunks of half a rank; DualPipeV one chunk more (DeepSeek-V3's table: PP + 1)
    assert [in_flight_chunks("zbv", 4, 8, 2, r) for r in range(4)] == [8] * 4
    assert [in_flight_chunks("dualpipev", 4, 8, 2, r) for r in range(4)] == [9] * 4
    assert last_stage_in_flight("zbv", 4, 8, 2) >= 1
    # with F = I = W the only idle time left is the first forward reaching the last rank:
    # (pp - 1) chunk forwards, ZB-H1's (pp - 1)(F + I - W) per chunk; interleaved 1F1B leaves 3x that
    for schedule in ("zero-bubble", "zbv", "dualpipev"):
        assert bubble_fraction(schedule, 4, 8, 2) == pytest.approx(1 - 24 / 25.5)
    assert bubble_fraction("interleaved-1f1b", 4, 8, 2) == pytest.approx(1.5 / 9.5)


CASES = [
    # its input crosses every stage, its first and last layers share a weight
    ("last_input.py", Plan(pp=2, schedule="zero-bubble", stages_per_rank=2, microbatches=4)),
    ("last_input.py", Plan(pp=2, schedule="zbv", stages_per_rank=2)),
    # long skip connections: a stage sends a tensor its own next convolution saved for its weight gradient
    ("unet.py", Plan(pp=2, schedule="dualpipev", stages_per_rank=2)),
    # both backwards go through each selective region: what it kept and what it recomputed serve both
    # (ops/activation_checkpoint.py's _RecomputeOnce)
    ("llama.py", Plan(pp=2, schedule="zero-bubble", stages_per_rank=2, checkpoint="selective")),
]


@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n.removesuffix('.py')}-{p.schedule}-{p.checkpoint}" for n, p in CASES])
def test_split_backward_matches_untouched_model(name, plan):
    path = EXAMPLES / name if (EXAMPLES / name).exists() else MODELS / name
    _, cmp = check_locally(load_model(str(path)), plan)
    assert cmp.ok, cmp.failures
    assert any("rank" in k for k in cmp.max_diff)


def test_split_backward_recomputes_each_checkpointed_region_once(monkeypatch):
    """The input gradients and the weight gradients are separate backwards, and torch's weight backward
    runs one `autograd.grad` per parameter group: torch's checkpoint would recompute a region for each
    (a Llama block reading 9 parameters 10 times a micro-batch). Under the split-backward schedules a
    region keeps what it recomputed for every later backward through it (`_RecomputeOnce`): it runs
    twice a micro-batch, forward and one recompute, as under 1F1B, for every policy."""
    calls: list[list[int]] = []
    original = CheckpointRegion._run_once

    def counted(self):
        run, mine = original(self), [0]
        calls.append(mine)

        def wrapper(*args):
            mine[0] += 1
            return run(*args)
        return wrapper

    monkeypatch.setattr(CheckpointRegion, "_run_once", counted)
    loaded = load_model(str(EXAMPLES / "llama.py"))
    for schedule, checkpoint in (("interleaved-1f1b", "blocks"), ("zero-bubble", "blocks"), ("zbv", "stage"),
                                 ("zero-bubble", "selective")):
        calls.clear()
        plan = Plan(pp=2, schedule=schedule, stages_per_rank=2, microbatches=2, checkpoint=checkpoint)
        _, cmp = check_locally(loaded, plan)
        assert cmp.ok, cmp.failures
        assert calls and {c[0] for c in calls} == {2}, (plan, sorted(c[0] for c in calls))


def test_stage_outputs_need_their_own_tensor_under_split_backward(monkeypatch):
    # the norm's output is sent and saved by `first`; torch's input backward detaches what a stage sent
    plan = Plan(pp=2, schedule="zbv", stages_per_rank=2, split_at=("norm", "second", "out"))
    model = load_model(str(MODELS / "sent_and_saved.py"))
    _, cmp = check_locally(model, plan)
    assert cmp.ok, cmp.failures
    monkeypatch.setattr(program_module, "SPLIT_BACKWARD_SCHEDULES", frozenset())  # sent as itself
    with pytest.raises(RuntimeError, match="detached in-place"):
        check_locally(model, plan)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_interleaved_schedules_run_micro_batch_counts_that_are_not_a_multiple_of_pp():
    """torch's flexible interleaving (the Llama 3 paper's change): 2 micro-batches over 4 ranks of 2
    stages each, under interleaved 1F1B and interleaved zero-bubble, equal the untouched model."""
    from graphsplit.launch.launcher import RunOptions, run_training

    for schedule in ("interleaved-1f1b", "zero-bubble"):
        lines: list[str] = []
        plan = Plan(pp=4, schedule=schedule, stages_per_rank=2, microbatches=2)
        cmp = run_training(str(EXAMPLES / "mlp.py"), plan, RunOptions(steps=1, check=True, timeout_s=240),
                           echo=lines.append)
        assert cmp is not None and cmp.ok, "\n".join(lines)


def test_a_value_computed_from_weights_alone_is_never_sent_under_split_backward():
    """`pos` embeds arange: sent by a stage after the first, its weight's gradient would come only
    through the send, which torch's weight backward never follows (pos.weight trained without one).
    The automatic cut avoids it; a cut the user names there is refused in one line."""
    model = load_model(str(MODELS / "weight_sent.py"))
    _, cmp = check_locally(model, Plan(pp=2, schedule="zbv", stages_per_rank=2))
    assert cmp.ok, cmp.failures
    with pytest.raises(GraphsplitError, match=r"stage 1 sends pos \(module pos\), computed from its weights alone"):
        check_locally(model, Plan(pp=2, schedule="zbv", stages_per_rank=2, split_at=("pos", "mid", "out")))
    # other schedules send it (its gradient flows back through the send)
    _, cmp = check_locally(model, Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2, split_at=("pos", "mid", "out")))
    assert cmp.ok, cmp.failures
