"""Python conditions on sizes known from the example inputs (graphsplit/ir/size_conditions.py):
decided while torch.fx traces, kept in the graph as checks that name the model's line, through every
pass; conditions on values still go to torch.export, whose narrowed size ranges are checked too."""

import io

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from rich.console import Console

from graphsplit import GraphsplitError, Plan
from graphsplit.ir.meta import module_path
from graphsplit.ir.trace import trace_model
from graphsplit.launch.parity import check_locally
from graphsplit.report.artifacts import stage_source
from graphsplit.report.summary import render, summarize
from graphsplit.rewrite import rewrite_loaded, rewrite_program

from .conftest import MODELS, traced_once


def _checks(program) -> list[int]:
    """The recorded checks in each stage, inside checkpointed regions too."""
    return [sum(n.target is torch._assert for m in st.gm.modules() if isinstance(m, fx.GraphModule)
                for n in m.graph.nodes) for st in program.stages]


def test_the_issue_repro_traces_with_fx_and_trains_at_pp_tp_and_both():
    """Issue 21: `assert t <= 64` before the blocks was fx's only obstacle. Each plan against the
    untouched model on the whole batch; the trace says why fx, and the check fails past 64 tokens."""
    loaded, traced = traced_once(MODELS / "attn_assert.py")
    assert traced.tracer == "fx"
    assert traced.reason == ('torch.fx (sizes decided on the example inputs: attn_assert.py:33 in forward '
                             '`assert t <= 64, "too long"`)')
    for plan in (Plan(pp=2), Plan(tp=2), Plan(pp=2, tp=2)):
        program, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, (plan, cmp.failures)
        assert any(k.startswith("grad") for k in cmp.max_diff) and "loss" in cmp.max_diff
        assert sum(_checks(program)) == 1
    with pytest.raises(AssertionError, match=r"^attn_assert\.py:33 in forward `assert t <= 64, \"too long\"` "
                                             r"was True on the example inputs and is False here"):
        traced.gm(torch.randn(2, 65, 32))


def test_every_decided_condition_survives_every_pass():
    """An assert on the sequence length, an `if` on it in each block, an assert on parameter sizes in
    each block and an `if` on the batch size. Checks on the input's sizes run first, once each (the
    input is not sent to the last stage to be measured there); those on a block's parameters stay in
    the block (inside its checkpointed region), under tp on the whole weight's size. Each plan against
    the untouched model; the stage files show the checks and are Python."""
    loaded, traced = traced_once(MODELS / "size_branches.py")
    assert traced.tracer == "fx" and traced.reason.count("size_branches.py:") == 4
    for plan in (Plan(pp=3, microbatches=2), Plan(pp=2, tp=2, checkpoint="blocks")):
        program, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, (plan, cmp.failures)
        assert sum(_checks(program)) == 5, _checks(program)
        assert [st.index for st in program.stages if "idx" in st.inputs] == [0]
        for st in program.stages:
            compile(stage_source(st, program), f"stage_{st.index}.py", "exec")
    text = stage_source(program.stages[0], program)
    assert "size_branches.py:45 in forward `assert t <= 64" in text and "size_branches.py:49" in text
    assert {module_path(n) for n in traced.gm.graph.nodes
            if n.target is torch._assert and "fused qkv" in str(n.args[1])} == {"blocks.0", "blocks.1"}


def test_a_micro_batch_that_decides_a_condition_otherwise_fails_in_one_line():
    """`if b >= 2:` held on the batch of 4; micro-batches of 1 would silently take the other branch."""
    loaded, traced = traced_once(MODELS / "size_branches.py")
    with pytest.raises(GraphsplitError) as exc:
        rewrite_loaded(loaded, Plan(pp=2, microbatches=4), traced=traced.copy())
    message = str(exc.value)
    assert message.startswith("size_branches.py:49 in forward `if b >= 2:` was True on the example inputs "
                              "and is False here: graphsplit traced only the branch the example inputs took")
    assert "--microbatches" in message and "\n" not in message


class _OnValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent: no size decides it
            x = x * 2
        return self.lin(x)


class _OnFlag(_OnValues):
    def forward(self, x, flag):
        if flag:  # a tensor input's value, whatever its size
            x = x * 2
        return self.lin(x)


class _OnComputedSize(_OnValues):
    def forward(self, x):
        h = self.lin(x)
        if h.size(0) > 1:  # the size of a computed tensor: not read before tracing
            h = h * 2
        return h


def test_conditions_on_values_are_not_decided_by_fx():
    """Values go to torch.export, as before, which refuses them."""
    for model, inputs in ((_OnValues(), (torch.randn(3, 4),)), (_OnFlag(), (torch.randn(3, 4), torch.tensor(True)))):
        with pytest.raises(GraphsplitError, match=rf"^cannot trace {type(model).__name__} at "
                                                  r"test_size_conditions.py:\d+ in forward: .*torch.fx said 'symbolically traced"):
            trace_model(model, inputs, {})


def test_a_condition_on_a_computed_tensors_size_is_decided_on_meta_and_checked():
    """`h = self.lin(x); if h.size(0) > 1:`: h's size is read from the op run on meta tensors (never its
    values), decided, and checked when the graph runs, as a condition on an input's size is."""
    model = _OnComputedSize()
    t = trace_model(model, (torch.randn(3, 4),), {})
    assert t.tracer == "fx" and "test_size_conditions.py:" in t.reason and "sizes decided" in t.reason
    x = torch.randn(3, 4)
    torch.testing.assert_close(t.gm(x)[0], model(x))  # the branch taken: h * 2
    with pytest.raises(AssertionError, match="was True on the example inputs and is False here"):
        t.gm(torch.randn(1, 4))


class _Exported(nn.Module):
    """`*inputs` sends it to torch.export, which keeps `if x.size(0) > 2:` as the batch dim's range."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *inputs):
        (x,) = inputs
        if x.size(0) > 2:
            x = x * 2
        return self.lin(x)


def test_a_size_range_torch_export_narrowed_is_checked():
    """Export checks its ranges in a guard the stages do not keep: micro-batches of 2 would take the
    traced branch silently."""
    m, x = _Exported(), torch.randn(4, 4)
    t = trace_model(m, (x,), {})
    assert t.tracer == "export"
    y = torch.randn(6, 4)
    torch.testing.assert_close(t.unflatten_output(t.gm(y)), m(y))
    with pytest.raises(GraphsplitError, match=r"^input 'inputs_0' had a size >= 3 in dim 0 when torch.export "
                                              r"traced the model \(a condition on that size\) and not here"):
        rewrite_program(m, (x,), {}, Plan(pp=2))
    assert rewrite_program(m, (x,), {}, Plan(pp=2, microbatches=1)).program.traced.tracer == "export"


class _Caches(nn.Module):
    """Takes len() of its input and caches what it builds from it on itself, as pytorch/examples'
    word_language_model does with its causal mask."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mask = None

    def forward(self, x):
        if self.mask is None or self.mask.size(0) != len(x):
            self.mask = torch.ones(len(x), 1)
        return self.lin(x) * self.mask


def test_len_of_an_input_is_a_checked_constant_and_the_model_is_left_as_it_was():
    m = _Caches()
    before = dict(vars(m))
    t = trace_model(m, (torch.randn(3, 4),), {})
    assert t.tracer == "fx" and "test_size_conditions.py:" in t.reason
    assert vars(m) == before and m.mask is None  # no proxy left on the user's module
    assert {n for n, _ in t.gm.named_buffers()} == {"_tensor_constant0"}  # the mask forward made
    x = torch.randn(3, 4)
    torch.testing.assert_close(t.unflatten_output(t.gm(x)), m(x))
    with pytest.raises(AssertionError, match=r"took len\(\) = 3 on the example inputs and another length here"):
        t.gm(torch.randn(5, 4))


def test_the_summary_says_which_tracer_and_why():
    loaded, traced = traced_once(MODELS / "attn_assert.py")
    program = rewrite_loaded(loaded, Plan(pp=2), traced=traced.copy()).program
    out = io.StringIO()
    render(summarize(program), Console(file=out, width=400))
    assert ('traced with torch.fx (sizes decided on the example inputs: attn_assert.py:33 in forward '
            '`assert t <= 64, "too long"`)') in out.getvalue()


def test_an_inputs_shape_unpacked_into_a_call_traces_with_fx():
    """`x.reshape(*x.shape[:-1], 2, -1)` iterates the shape: its entries, from the example inputs,
    one by one (the number of dims checked), where fx alone says a Proxy cannot be iterated."""

    class Pairs(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            pairs = x.reshape(*x.shape[:-1], 4, 2)
            return self.lin(pairs.flip(-1).reshape(*[d for d in x.shape]))

    x = torch.randn(4, 3, 8)
    model = Pairs()
    traced = trace_model(model, (x,), {})
    assert traced.tracer == "fx", traced.reason
    program = rewrite_program(model, (x,), {}, Plan(dp=2)).program
    assert program.batch.inputs == {"x": 0}
    out = traced.gm(x)
    torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, model(x))


def test_forward_with_kwargs_it_is_not_given_traces_with_fx_and_keeps_its_output_type():
    """`forward(self, input_ids, labels=None, **kwargs)` with a branch on its buffer (torch.export
    cannot decide it) and on a hidden state's size in each block: fx on the named parameters, the
    `**kwargs` empty as the call has them; the model's ModelOutput comes back as itself."""
    loaded, traced = traced_once(MODELS / "kwargs_output.py")
    assert traced.tracer == "fx", traced.reason
    assert "forward's *args/**kwargs empty" in traced.reason
    assert "kwargs_output.py:32 in forward `if seq_len > 1:" in traced.reason and "kwargs_output.py:46" in traced.reason
    want = loaded.build("cpu")(**loaded.kwargs)
    out = traced.unflatten_output([want.loss, want.logits])
    assert type(out) is type(want) and out.loss is want.loss and out.logits is want.logits  # not a plain dict
    for plan in (Plan(pp=2), Plan(tp=2), Plan(dp=2, pp=2)):
        _, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, (plan, cmp.failures)
