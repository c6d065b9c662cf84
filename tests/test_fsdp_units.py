"""FSDP's units: one policy (ir/regions.py: `fsdp_units`) that the program, the report and the planner read."""

from __future__ import annotations

import numpy as np
import pytest

from graphsplit import Plan
from graphsplit.ir.regions import StageRegion, fsdp_units
from graphsplit.loader import load_model
from graphsplit.planner import load_hardware, profile_model
from graphsplit.planner.param_reads import unit_bytes
from graphsplit.planner.stages import region_spans
from graphsplit.report.summary import summarize
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES


def test_a_region_is_a_unit_when_nothing_else_in_its_stage_reads_its_parameters():
    alone = StageRegion("ckpt_0", frozenset({"h.0.w"}))
    tied = StageRegion("ckpt_1", frozenset({"h.1.w", "wte.weight"}))  # its weight tied to the LM head's
    shared = [StageRegion("ckpt_2", frozenset({"shared.w"})), StageRegion("ckpt_3", frozenset({"shared.w", "h.3.w"}))]
    empty = StageRegion("ckpt_4", frozenset())  # nothing to shard
    regions = [alone, tied, *shared, empty]
    assert fsdp_units(Plan(dp=2, fsdp=True), regions, {"wte.weight"}) == [alone]
    assert fsdp_units(Plan(dp=2, fsdp=True), regions, ()) == [alone, tied]
    assert fsdp_units(Plan(dp=2), regions, ()) == []  # no FSDP
    # a split backward (weight gradients by autograd.grad): one unit a stage
    assert fsdp_units(Plan(dp=2, pp=2, fsdp=True, schedule="zbv", stages_per_rank=2), regions, ()) == []


@pytest.fixture(scope="module")
def gpt():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    profile = profile_model(loaded, (1,))
    profile.hardware = load_hardware("cpu")
    return loaded, profile


@pytest.mark.parametrize("checkpoint", ["none", "blocks", "every:2"])
def test_the_program_the_report_and_the_planner_choose_the_same_units(gpt, checkpoint):
    """GPT with its LM head tied to the token embedding: the program's units (what the backend wraps), the
    report's and the planner's are the same blocks, holding the same parameter bytes."""
    loaded, profile = gpt
    plan = Plan(dp=2, fsdp=True, checkpoint=checkpoint)
    program = rewrite_loaded(loaded, plan).program
    (stage,) = program.stages
    names = program.fsdp_units(0)
    # every block but the last, which holds the LM head, its weight tied to the embedding outside the regions
    assert names == [r.name for r in stage.regions if "wte.weight" not in r.reads] and names
    assert len(names) == len(stage.regions) - 1
    assert summarize(program)["fsdp_units"] == [{"stage": 0, "regions": names, "reshard_after_forward": True}]
    held = sum(p.numel() * p.element_size() for name in names for p in stage.gm.get_submodule(name).parameters())
    table = profile.table(plan)
    sizes = unit_bytes(table, plan, region_spans(table, "blocks" if checkpoint == "none" else checkpoint, 0, table.n))
    assert int(np.count_nonzero(sizes)) == len(names) and int(sizes.sum()) == held


def test_a_stage_checkpointed_whole_is_one_unit_its_tied_weight_inside(gpt):
    """`stage` checkpointing makes the whole stage one region, the tied embedding and LM head inside it and
    nothing read outside: one unit, in the program and in the planner."""
    loaded, profile = gpt
    plan = Plan(dp=2, fsdp=True, checkpoint="stage")
    program = rewrite_loaded(loaded, plan).program
    (stage,) = program.stages
    assert [r.name for r in stage.regions] == program.fsdp_units(0) and not stage.read_outside_regions
    table = profile.table(plan)
    assert int(np.count_nonzero(unit_bytes(table, plan, region_spans(table, "stage", 0, table.n)))) == 1
