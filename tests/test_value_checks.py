"""Checks on tensor values in forward (ir/value_checks.py): `if labels.max() >= V: raise`, `if a or b: raise`,
`assert (...).all()` are taken the way that does not raise and kept in the graph as checks, by torch.fx
and by torch.export alike: the program trains as the untouched model, and still raises the model's own
exception on bad data. Any other branch on a value is still refused in one line."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.ir.trace import trace_model
from graphsplit.ir.value_checks import ValueCheck
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.rewrite import trace_loaded

from .conftest import MODELS, traced_once

MODEL = MODELS / "value_checks.py"
PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "dp2-pp2": Plan(dp=2, pp=2)}


def _checks(traced):
    return [n.target for n in traced.gm.graph.nodes if isinstance(n.target, ValueCheck)]


@pytest.mark.parametrize("builder", ["build_model", "build_keyword_model"])
def test_each_check_is_kept_and_still_raises_on_bad_data(builder):
    loaded = load_model(f"{MODEL}:{builder}")
    traced = trace_loaded(loaded)
    assert traced.tracer == ("fx" if builder == "build_model" else "export")
    assert "checks on tensor values kept as checks: value_checks.py:26" in traced.reason
    # `labels.max() >= V` must be false, `idx.min() < 0` and `idx.max() >= V` false, isfinite(...).all() true
    assert [(c.holds, c.error) for c in _checks(traced)] == [
        (False, ValueError), (False, IndexError), (False, IndexError), (True, AssertionError)]
    model = loaded.build("cpu", seed=0)
    gm = traced.gm
    gm.load_state_dict(model.state_dict(), assign=True)

    def run(idx, labels):  # the graph as a stage runs it
        return torch.fx.Interpreter(gm).run(idx, labels)[0]

    args = loaded.kwargs
    torch.testing.assert_close(run(args["idx"], args["labels"]), model(**args))
    bad = args["labels"].clone()
    bad[0, 0] = 32
    with pytest.raises(ValueError, match="value_checks.py:26"):
        run(args["idx"], bad)
    with pytest.raises(IndexError, match="value_checks.py:28"):
        run(-args["idx"] - 1, args["labels"])


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_program_trains_as_the_untouched_model(plan):
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.inputs == {"idx": 0, "labels": 0}  # the checks' reductions do not hide the batch


def test_a_branch_on_values_that_is_no_check_is_refused_in_one_line():
    class Branches(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                x = x * 2
            return x

    with pytest.raises(GraphsplitError) as exc:
        trace_model(Branches(), (torch.randn(2, 3),), {})
    message = str(exc.value)
    assert "reads tensor values into Python" in message and "if x.sum() > 0:" in message and "\n" not in message


def test_an_and_whose_tensor_operand_comes_first_is_not_taken_for_a_check():
    """`if a.any() and flag_tensor.any(): raise` raises only when both hold: taking the first false would
    make the program stricter than the model, so it stays a data-dependent branch."""

    class Both(torch.nn.Module):
        def forward(self, x, y):
            if x.max() > 100 and y.max() > 100:
                raise ValueError("both large")
            return x + y

    with pytest.raises(GraphsplitError, match="reads tensor values into Python"):
        trace_model(Both(), (torch.randn(2, 3), torch.randn(2, 3)), {})


# -- a branch on the model's own buffers (minimind's `if self.freqs_cos[0, 0] == 0:`) ------------------

BUFFER_BRANCH = MODELS / "buffer_branch.py"


def test_a_branch_on_the_model_s_own_buffer_is_taken_as_the_constructor_left_it_and_checked():
    """Traced on meta, the buffer's value comes from the constructor run for its buffers alone; the
    branch is decided by it (not taken), kept as a check, and the program trains as the model does."""
    loaded = load_model(str(BUFFER_BRANCH))
    traced = trace_loaded(loaded)
    assert traced.tracer == "fx" and "branches on the model's buffers" in traced.reason, traced.reason
    assert "buffer_branch.py:21" in traced.reason
    [check] = [n.target for n in traced.gm.graph.nodes if isinstance(n.target, ValueCheck)]
    assert check.holds is False
    for plan in (Plan(pp=2), Plan(tp=2)):
        program, cmp = check_locally(loaded, plan, traced=traced)
        assert cmp.ok, cmp.failures
    # a run whose buffer holds what the branch was traced away from raises, naming the line
    with pytest.raises(RuntimeError, match="buffer_branch.py:21"):
        check(torch.zeros(()) == 0)


def test_a_branch_on_a_parameter_s_value_is_still_refused():
    """A parameter's value is the init's, not the run's: a branch on it stays data-dependent."""
    class OnWeight(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            if self.lin.weight[0, 0] > 0:
                return self.lin(x)
            return x

    with pytest.raises(GraphsplitError, match="reads tensor values"):
        trace_model(OnWeight(), (torch.randn(2, 4),), {})


def test_a_branch_after_an_in_place_update_of_a_buffer_does_not_run_it_while_tracing():
    """`if self.calls.add_(1) > 10:` is not decided by running the update on the model's buffer (tracing
    would change the model): it stays a branch on values, refused, the buffer as it was."""
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            if self.calls.add_(1) > 10:
                return x
            return self.lin(x)

    model = Counting()
    with pytest.raises(GraphsplitError, match="reads tensor values"):
        trace_model(model, (torch.randn(2, 4),), {})
    assert float(model.calls) == 0.0
