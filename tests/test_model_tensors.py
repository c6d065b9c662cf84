"""Tensors a model's own code makes (ir/devices.py, LoadedModel.build): plain tensor attributes keep
their values when the model is built on meta, factory calls without `device=` (in forward and in
loss_fn) make tensors beside the model's own wherever the code runs (meta in the analysis, the
rank's device in the program), and a target with no batch dim goes whole to every micro-batch.
Checked against the untouched model on the whole batch; one plan on real processes."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.ir.devices import NEUTRAL
from graphsplit.ir.factories import makes_tensor
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally

from .conftest import MODELS, traced_once

MODEL = MODELS / "plain_tensors.py"
PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "dp2-pp2": Plan(dp=2, pp=2)}


def test_a_meta_build_keeps_the_values_of_plain_tensor_attributes():
    loaded, _ = traced_once(MODEL)
    meta, real = loaded.build("meta"), loaded.build("cpu")
    assert meta.inp.weight.device.type == "meta"  # parameters cost nothing
    for attr in ("table", "mask"):  # made in the constructor, and by a method called after it
        assert getattr(meta, attr).device.type == "cpu"
        torch.testing.assert_close(getattr(meta, attr), getattr(real, attr))


def test_factory_calls_say_the_graphs_device():
    """torch.fx records `torch.arange(T)` as written: the trace gives it the graph's neutral device (the
    model's own `device=x.device` stays), as torch.export records its own."""
    _, traced = traced_once(MODEL)
    assert traced.tracer == "fx"  # the plain attributes indexed by traced sizes are graph values
    made = [n for n in traced.gm.graph.nodes if makes_tensor(n)]
    assert [n.target.__name__ for n in made] == ["arange"]  # the positions; the table is a constant
    assert made[0].kwargs["device"] == NEUTRAL

    class Positions(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[1]) + torch.zeros(x.shape[1], device=x.device)

    from graphsplit.ir.trace import trace_model

    made = [n for n in trace_model(Positions(), (torch.randn(2, 3),), {}).gm.graph.nodes if makes_tensor(n)]
    assert [n.target.__name__ for n in made] == ["arange", "zeros"]
    assert made[0].kwargs["device"] == NEUTRAL and made[1].kwargs["device"] != NEUTRAL


def test_plain_attributes_are_the_programs_constants_not_weights():
    loaded, traced = traced_once(MODEL)
    program, _ = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    constants = {name for stage in program.stages for name in stage.constants}
    assert {"table", "mask"} <= constants
    assert not any("table" in c or "mask" in c for stage in program.stages for c in stage.buffer_sources.values())


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_program_trains_as_the_untouched_model(plan):
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.target == (None,)  # the 0-dim target: whole to every piece
    assert program.batch.inputs == {"x": 0} and program.plan.num_microbatches == plan.pp  # cut, not one piece


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_real_processes_with_a_target_every_micro_batch_takes_whole():
    """torch's schedules cut a target along dim 0: a 0-dim one arrives as one copy per micro-batch."""
    lines: list[str] = []
    cmp = run_training(str(MODEL), Plan(dp=2, pp=2), RunOptions(steps=2, check=True, timeout_s=240), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert lines[-1].startswith("check passed")
