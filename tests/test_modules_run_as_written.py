"""A submodule whose forward branches on the data (`if mask.any():` around an expert, a one-hot sized by
`int(indexes.max()) + 1`) is kept as one call_module node and runs as its author wrote it on each
micro-batch (ir/eager_modules.py); the analyses run it on CPU stand-ins (ir/cpu_stand_ins.py). What it writes
to itself in forward (a balancing loss in `self.aux_loss`) is read by the graph after each call, on
the rank whose copy ran. Against the untouched model on the whole batch; minimind's, lucidrains' and
TimesNet's own code, unchanged, are in the outside zoo (tests/test_outside_zoo.py)."""

import pytest
import torch
import torch.nn as nn

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.ir.eager_modules import is_written_read, state_spans
from graphsplit.ir.trace import trace_model
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.passes.pipeline_split import liveness
from graphsplit.rewrite import rewrite_program

from .conftest import MODELS, traced_once

MOE = MODELS / "data_dependent_moe.py"
AUX = f"{MOE}:build_aux_model"


def test_the_modules_that_branch_on_the_data_run_as_written_and_the_rest_is_traced():
    loaded, traced = traced_once(MOE)
    assert traced.tracer == "fx" and traced.eager == ("blocks.0.moe", "blocks.1.moe")
    assert "run as written" in traced.reason and "data_dependent_moe.py:46" in traced.reason, traced.reason
    calls = [n.target for n in traced.gm.graph.nodes if n.op == "call_module"]
    assert "blocks.0.moe" in calls and not any(c.startswith("blocks.0.moe.") for c in calls)
    assert "blocks.0.norm" in calls and "head" in calls  # the rest: traced through as usual


@pytest.mark.parametrize("plan", [Plan(dp=2, pp=2), Plan(tp=2), Plan(dp=2, fsdp=True)], ids=["dp2-pp2", "tp2", "fsdp2"])
def test_per_token_experts_keep_the_samples_apart_and_train_as_the_untouched_model(plan):
    loaded, traced = traced_once(MOE)
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.inputs == {"idx": 0}  # found through the experts' own ops, run on CPU stand-ins
    assert program.plan.num_microbatches == plan.pp


def test_what_a_module_writes_in_forward_is_read_after_each_call_in_the_stage_that_ran_it():
    loaded, traced = traced_once(AUX)
    reads = [n for n in traced.gm.graph.nodes if is_written_read(n)]
    assert [(str(n.args[0].target), n.args[1]) for n in reads] == [("blocks.0.moe", "aux_loss"),
                                                                     ("blocks.1.moe", "aux_loss")]
    for plan in (Plan(pp=2), Plan(tp=2)):
        program, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, cmp.failures
    program = rewrite_program(loaded.build("meta"), loaded.args, {}, Plan(pp=2), loaded.path, loss_fn=loaded.loss_fn,
                              target=loaded.target).program
    for stage in program.stages:
        ran = {str(n.target) for n in stage.gm.graph.nodes if n.op == "call_module"}
        read = {str(n.args[0].target) for n in stage.gm.graph.nodes if is_written_read(n)}
        assert read <= ran, (stage.index, read, ran)
    # no cut may fall between a call and the read of what it wrote (the cut before seq[k] is k)
    seq, _, crossing = liveness(program.traced.gm)
    spans = list(state_spans(program.traced.gm.graph))
    assert len(spans) == 2
    for call, read in spans:
        assert all(crossing[seq.index(call) + 1: seq.index(read) + 1]), (call.name, read.name)


def test_a_balancing_loss_over_the_whole_batch_is_no_batch_refused_at_dp_in_one_line():
    loaded, traced = traced_once(AUX)
    with pytest.raises(GraphsplitError) as exc:
        check_locally(loaded, Plan(dp=2, pp=2), traced=traced.copy())
    message = str(exc.value)
    # the mean inside the module run as written, named at its own line
    assert "no batch: dim 0 of 'idx': mean over it at data_dependent_moe.py:51" in message and "\n" not in message


def test_the_analyses_leave_nothing_in_the_model():
    loaded = load_model(AUX)
    model = loaded.build("cpu", seed=0)
    rewrite_program(model, loaded.args, {}, Plan(pp=2), loaded.path, loss_fn=loaded.loss_fn, target=loaded.target)
    assert all("aux_loss" not in vars(block.moe) for block in model.blocks)
    model(*loaded.args)  # and the model still runs as it did


def test_a_shape_unpacked_into_a_tuple_and_an_item_assigned_are_traced_by_fx():
    """`b, n, d, e = *x.shape, k` asks `len()` of the shape (lucidrains' MoE); `f[0] = 0` assigns into a
    traced value (TimesNet): both were fx failures that sent the model to torch.export."""

    class Both(nn.Module):
        def forward(self, x):
            b, n, d, e = *x.shape, 3
            y = x.mean(-1)
            y[:, 0] = 0
            return y.reshape(b, n) * e + d

    x = torch.randn(2, 4, 5)
    traced = trace_model(Both(), (x,), {})
    assert traced.tracer == "fx", traced.reason
    torch.testing.assert_close(traced.gm(x)[0], Both()(x))


def test_a_branch_on_the_data_in_forward_itself_is_still_refused_in_one_line():
    class Top(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(GraphsplitError, match="reads tensor values into Python"):
        trace_model(Top(), (torch.randn(2, 3),), {})
