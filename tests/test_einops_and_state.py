"""Model code the tracer meets in libraries: einops on torch.fx's proxies (ir/einops_proxies.py), a
buffer's `.grad` read in forward (decided as the model holds it, and checked), and a buffer written in
place in forward, an EMA, which stays in one pipeline stage with every op that reads it (each stage holds
its own copy of a buffer: one that read it and another that wrote it would each see their own)."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.ir.trace import trace_model
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_program

from .conftest import MODELS


def test_a_model_written_with_einops_traces_with_fx_and_equals_the_whole_batch():
    loaded = load_model(str(MODELS / "written_state.py"))
    program, cmp = check_locally(loaded, Plan(dp=2, pp=2))
    assert cmp.ok, cmp.failures
    assert program.traced.tracer == "fx", program.traced.reason
    assert program.batch.size == 8 and program.batch.inputs == {"x": 0}  # a pack of one tensor keeps the batch


def test_a_buffer_written_in_forward_stays_in_the_stage_that_reads_it():
    loaded = load_model(f"{MODELS / 'written_state.py'}:build_ema")
    loaded.args = (torch.randn(8, 6, generator=torch.Generator().manual_seed(1)),)
    program = rewrite_program(loaded.build("meta"), loaded.args, {}, Plan(pp=2)).program
    touching = [s.index for s in program.stages
                if any(n.op == "get_attr" and str(n.target).endswith("centre") for n in s.gm.graph.nodes)]
    assert len(touching) == 1, touching  # its read (before mid) and its lerp_ (after it): one stage
    assert any("lerp_" in str(n.target) for n in program.stages[touching[0]].gm.graph.nodes)
    _, cmp = check_locally(loaded, Plan(pp=2))
    assert cmp.ok, cmp.failures


def test_a_buffers_grad_read_in_forward_is_decided_and_checked():
    model = load_model(f"{MODELS / 'written_state.py'}:build_ema").build("cpu")
    x = torch.randn(8, 6)
    traced = trace_model(model, (x,), {})
    assert traced.tracer == "fx", traced.reason
    traced.gm(x)  # no gradient on the buffer, as when traced
    traced.gm.get_buffer("centre").grad = torch.ones(16)
    with pytest.raises(RuntimeError, match=r"graphsplit traced centre\.grad as None"):
        traced.gm(x)


def test_a_buffer_rebound_in_forward_is_traced_with_its_update(monkeypatch):
    """`self.calls += 1` on a buffer: torch.fx records no write (it would drop the update and leave its proxy
    in the module), so graphsplit takes torch.export's graph, whose update is `copy_` into the buffer, moved
    from the graph's end to where the new count is made: the pipeline still cuts between the layers. The
    program counts once per micro-batch and says so."""
    from graphsplit.launch.state_notes import state_notes

    monkeypatch.delenv("REBOUND_REDRAW", raising=False)
    loaded = load_model(str(MODELS / "rebound_buffer.py"))
    model = loaded.build("cpu")
    traced = trace_model(model, loaded.args, {})
    assert traced.tracer == "export" and "rebinds the module attribute 'calls'" in traced.reason
    nodes = list(traced.gm.graph.nodes)
    (write,) = [n for n in nodes if "copy_" in str(n.target)]
    assert nodes.index(write) < min(i for i, n in enumerate(nodes) if "linear" in str(n.target))
    traced.gm(*loaded.args)
    traced.gm(*loaded.args)
    assert int(traced.gm.get_buffer("calls")) == 2  # the update runs
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert cmp.ok, cmp.failures
    assert len(program.stages) == 2
    (note,) = state_notes(program)
    assert "calls" in note and "once per micro-batch (2 a step)" in note


def test_a_branch_on_a_rebound_buffer_is_refused_in_one_line(monkeypatch):
    """performer-pytorch's redraw: forward also branches on the counter's value, which neither tracer can
    hold in one graph: refused in one line naming the line and the rebinding (it crashed with a traceback)."""
    from graphsplit.errors import GraphsplitError

    monkeypatch.setenv("REBOUND_REDRAW", "1")
    loaded = load_model(str(MODELS / "rebound_buffer.py"))
    with pytest.raises(GraphsplitError, match=r"rebound_buffer\.py:\d+ in forward.*rebinds the module attribute 'calls'"):
        check_locally(loaded, Plan(pp=2))
