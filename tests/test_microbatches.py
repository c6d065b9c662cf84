"""Default micro-batches: a count that divides the batch, filling the pipeline when the batch allows."""

import json

import pytest
from click.testing import CliRunner

from graphsplit import Plan
from graphsplit.cli import main
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import EXAMPLES, MODELS


@pytest.mark.parametrize("plan, share, microbatches, schedule", [
    (Plan(pp=3), 8, 4, "1f1b"),  # the fewest that divide 8 and fill 3 stages
    (Plan(pp=3), 4, 4, "1f1b"),
    (Plan(pp=3), 9, None, "1f1b"),  # the default, one per stage, divides 9: left as it is
    (Plan(pp=4), 16, None, "1f1b"),
    (Plan(pp=8), 1, 1, "gpipe"),  # too small to fill: as many as it has samples; 1F1B needs one per stage
    (Plan(pp=4), 2, 2, "gpipe"),
    (Plan(pp=4, schedule="gpipe"), 6, 6, "gpipe"),
    (Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2), 6, 6, "interleaved-1f1b"),  # multiples of pp
    (Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2), 2, 2, "interleaved-1f1b"),
    (Plan(pp=3, microbatches=3), 8, 3, "1f1b"),  # an explicit count is the user's (refused later if it does not divide)
    (Plan(), 5, None, "1f1b"),
])
def test_default_microbatches_divide_the_batch(plan, share, microbatches, schedule):
    decided = plan.for_batch(share)
    assert decided.microbatches == microbatches and decided.schedule == schedule
    assert share % decided.num_microbatches == 0 or plan.microbatches is not None


def test_a_batch_the_stage_count_does_not_divide_trains_like_the_untouched_model():
    program, cmp = check_locally(load_model(str(EXAMPLES / "gpt.py")), Plan(pp=3))  # batch 8: 4 micro-batches
    assert program.plan.num_microbatches == 4
    assert cmp.ok, cmp.failures


def test_batch_one_runs_one_microbatch_and_says_the_pipeline_is_not_filled(tmp_path):
    program, cmp = check_locally(load_model(str(MODELS / "batch_one.py")), Plan(pp=4))
    assert (program.plan.num_microbatches, program.plan.schedule) == (1, "gpipe")
    assert cmp.ok, cmp.failures
    done = CliRunner().invoke(main, ["transform", str(MODELS / "batch_one.py"), "--pp", "4", "--json"])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert summary["microbatches"] == 1
    assert summary["note"] == ("the batch gives 1 micro-batch for 4 pipeline stages: at most 1 stage works at a time "
                               "(bubble 75%); a batch of 4 or more per replica fills the pipeline")


def test_transform_writes_the_decided_count_and_an_explicit_one_gets_the_valid_counts(tmp_path):
    runner = CliRunner()
    done = runner.invoke(main, ["transform", str(EXAMPLES / "mlp.py"), "--pp", "3", "--out", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert "4 micro-batches" in done.output
    assert json.loads((tmp_path / "o" / "plan.json").read_text())["plan"]["microbatches"] == 4
    done = runner.invoke(main, ["transform", str(EXAMPLES / "mlp.py"), "--pp", "3", "--microbatches", "3"])
    assert done.exit_code == 2 and "give --microbatches dividing 16 (1, 2, 4, 8, 16)" in done.output
