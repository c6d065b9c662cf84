"""A model's own torch.autograd.Function stays one node whose backward is the Function's own
(ir/autograd_functions.py): traced through, a gradient-reversal layer is an identity and a
straight-through sign a sign, and autograd would differentiate those instead. Checked against the
untouched model on the whole batch at pp 2, tp 2 and dp 2 x pp 2; where torch.fx cannot trace the
model, torch.export would trace through the Function, so the model is refused in one line."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.compile import trace_loaded
from graphsplit.errors import GraphsplitError
from graphsplit.ir.autograd_functions import user_function
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS, traced_once

MODEL = MODELS / "own_function.py"
PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "dp2-pp2": Plan(dp=2, pp=2)}


def test_each_function_is_one_node_with_its_own_backward():
    loaded, traced = traced_once(MODEL)
    called = [user_function(n).__name__ for n in traced.gm.graph.nodes if user_function(n) is not None]
    assert called == ["GradReverse", "SignStraightThrough"]
    # nothing of their forwards is left in the graph: the sign is computed inside the call
    assert not any("sign" in str(n.target) for n in traced.gm.graph.nodes if n.op == "call_function"
                   and user_function(n) is None)
    assert "autograd Functions kept whole" in traced.reason and "GradReverse" in traced.reason
    # the graph computes what the model computes, gradients included (the reversal and the straight-through)
    model = loaded.build("cpu", seed=0)
    gm = trace_loaded(loaded).gm  # on meta: give it the model's real weights
    gm.load_state_dict(model.state_dict(), assign=True)
    x = loaded.args[0]
    expected = torch.autograd.grad(loaded.loss_fn(model(x), loaded.target), model.l1.weight)[0]
    got = torch.autograd.grad(loaded.loss_fn(gm(x)[0], loaded.target), gm.get_parameter("l1.weight"))[0]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_program_trains_as_the_untouched_model(plan):
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert any(k.startswith("grad l1.") for k in cmp.max_diff), cmp.max_diff  # upstream of both Functions


def test_a_model_only_torch_export_traces_is_refused_in_one_line():
    loaded = load_model(f"{MODEL}:build_keyword_model")
    with pytest.raises(GraphsplitError) as exc:
        trace_loaded(loaded)
    message = str(exc.value)
    assert message.startswith("cannot keep the autograd Function GradReverse (own_function.py:16), "
                              "SignStraightThrough (own_function.py:27) whole: torch.fx failed")
    assert "forward takes *args/**kwargs" in message and "\n" not in message
