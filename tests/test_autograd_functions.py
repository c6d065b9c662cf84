"""A model's own torch.autograd.Function stays one node whose backward is the Function's own
(ir/autograd_functions.py): traced through, a gradient-reversal layer is an identity and a
straight-through sign a sign, and autograd would differentiate those instead. Checked against the
untouched model on the whole batch at pp 2, tp 2 and dp 2 x pp 2; where torch.fx cannot trace the
model, torch.export would trace through the Function, so the model is refused in one line."""

import sys

import pytest
import torch

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.ir.autograd_functions import user_function
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.rewrite import trace_loaded

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


def test_through_torch_export_each_function_is_one_node_too():
    """`forward(x, **kwargs)`: torch.fx is not tried, torch.export traces it, with each Function one op
    while it traces (ir/autograd_functions.py: functions_as_ops), then that op the Function's own call."""
    loaded = load_model(f"{MODEL}:build_keyword_model")
    traced = trace_loaded(loaded)
    assert traced.tracer == "export" and "autograd Functions kept whole" in traced.reason
    classes = [user_function(n) for n in traced.gm.graph.nodes if user_function(n) is not None]
    assert [cls.__name__ for cls in classes] == ["GradReverse", "SignStraightThrough"]
    assert not any("function_call" in str(n.target) for n in traced.gm.graph.nodes)
    assert all("apply" not in vars(cls) for cls in classes)  # the trace left the classes as they were
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced)
    assert cmp.ok, cmp.failures


RECOMPUTE = MODELS / "recompute_function.py"


@pytest.mark.parametrize("factory,tracer", [("build_model", "fx"), ("build_keyword_model", "export")])
def test_a_checkpointing_function_given_the_blocks_method_is_traced_through(factory, tracer):
    """Megatron's / DeepSpeed's / latent diffusion's CheckpointFunction (no_grad forward of a callable,
    enable_grad recompute and autograd.grad in backward): its gradient is the callable's, so the callable's
    ops are traced with their gradients, under torch.fx and torch.export, and the program trains as the
    untouched model at pp 2, tp 2 and dp 2 x pp 2 (every block's gradient compared)."""
    loaded = load_model(f"{RECOMPUTE}:{factory}")
    traced = trace_loaded(loaded)
    assert traced.tracer == tracer and "recompute a callable" in traced.reason and "CheckpointFunction" in traced.reason
    assert not any(user_function(n) for n in traced.gm.graph.nodes)
    function = sys.modules[type(loaded.build("meta")).__module__].CheckpointFunction
    assert "apply" not in vars(function)  # the trace left the class as it was
    for plan in PLANS.values():
        program, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, cmp.failures
        compared = {key.split(" (")[0] for key in cmp.max_diff}
        assert {f"grad blocks.{i}.up.weight" for i in range(4)} <= compared, cmp.max_diff


def test_a_function_given_a_callable_is_refused_in_one_line():
    """Kept whole, a Function given `self._forward` that does not recompute it (a forward run with gradients,
    a backward of its own) would run the model's own module outside the program: refused, naming it."""

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, run, x):
            ctx.run = run
            return run(x)

        @staticmethod
        def backward(ctx, grad):
            return None, grad

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x):
            return Recompute.apply(self.inner, x)

    from graphsplit.ir.trace import trace_model

    with pytest.raises(GraphsplitError) as exc:
        trace_model(Net(), (torch.randn(2, 4),), {})
    message = str(exc.value)
    assert "the autograd Function" in message and "Recompute" in message and "takes a Linear" in message
    assert "\n" not in message
