import pytest
import torch
import torch.nn as nn

from graphsplit import GraphsplitError, Plan
from graphsplit.ir.op_kinds import OpKind, classify
from graphsplit.ir.trace import trace_model
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model


class Kw(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask=None, scale=2.0):
        y = self.lin(x) * scale
        if mask is not None:
            y = y + mask
        return {"y": y, "none": None}


def test_fx_bakes_non_tensor_inputs_and_keeps_output_structure():
    m = Kw()
    x = torch.randn(3, 4)
    t = trace_model(m, (x,), {})
    assert t.tracer == "fx"
    assert t.input_names == ["x"]
    out = t.unflatten_output(t.gm(*t.flatten_inputs((x,), {})))
    assert set(out) == {"y", "none"} and out["none"] is None
    torch.testing.assert_close(out["y"], m(x)["y"])


def test_keyword_tensor_inputs_become_placeholders():
    m = Kw()
    x, mask = torch.randn(3, 4), torch.randn(3, 4)
    t = trace_model(m, (x,), {"mask": mask})
    assert t.input_names == ["x", "mask"]
    out = t.unflatten_output(t.gm(*t.flatten_inputs((), {"x": x, "mask": mask})))
    torch.testing.assert_close(out["y"], m(x, mask=mask)["y"])


class ShapeBranch(nn.Module):
    """`forward(*inputs)` sends it to torch.export (fx makes no placeholder of a var-arg it is given),
    which keeps `if h.shape[0] > 1` as a guard on the batch size (fx decides such conditions itself:
    test_size_conditions.py)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *inputs):
        (x,) = inputs
        h = x.transpose(0, 1).transpose(0, 1)
        if h.shape[0] > 1:
            x = x * 3
        return self.lin(x)


def test_export_fallback_gives_aten_graph_with_symbolic_batch():
    m = ShapeBranch()
    x = torch.randn(4, 4)
    t = trace_model(m, (x,), {})
    assert t.tracer == "export"
    kinds = {classify(n, t.gm) for n in t.gm.graph.nodes}
    assert OpKind.LINEAR in kinds  # aten.linear, classified by the same table as nn.Linear
    # the graph runs at another batch size than it was traced with
    y = torch.randn(6, 4)
    torch.testing.assert_close(t.unflatten_output(t.gm(y)), m(y))


def test_untraceable_model_names_file_and_line(models_dir):
    loaded = load_model(str(models_dir / "untraceable.py"))
    with pytest.raises(GraphsplitError, match=r"cannot trace DataDependent at untraceable\.py:\d+"):
        trace_model(loaded.build("meta"), loaded.args, loaded.kwargs, loaded.path)


def test_op_table_classifies_module_and_function_spellings():
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.emb = nn.Embedding(10, 4)

        def forward(self, idx, x):
            return self.lin(x) + torch.nn.functional.linear(x, self.lin.weight) + self.emb(idx)

    t = trace_model(Both(), (torch.zeros(2, dtype=torch.long), torch.randn(2, 4)), {})
    kinds = [classify(n, t.gm) for n in t.gm.graph.nodes]
    assert kinds.count(OpKind.LINEAR) == 2
    assert kinds.count(OpKind.EMBEDDING) == 1


class _DeviceBranch(nn.Module):
    """Branches on where its tensors live, as HF's grouped experts do (histc takes floats on CPU)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, idx):
        counts = torch.histc(idx.float() if idx.device.type == "cpu" else idx.int(), bins=4, min=0, max=3)
        return counts * self.w


def test_meta_model_traces_the_branch_it_takes_on_cpu():
    idx = torch.tensor([0, 1, 1, 3])
    with torch.device("meta"):
        model = _DeviceBranch()
    traced = trace_model(model, (idx,), {})
    assert traced.tracer == "export"
    assert all(p.device.type == "meta" for p in traced.gm.parameters())  # device-neutral, as on meta
    histc = next(n for n in traced.gm.graph.nodes if "histc" in str(n.target))
    # traced on meta as such, the int32 branch: "histogram_cpu" not implemented for 'Int' at run time
    assert histc.args[0].meta["val"].dtype == torch.float32
    assert "device(type='cpu')" not in traced.gm.code  # factory devices say meta, retargeted per rank


class _Exported(nn.Module):
    """fx cannot take `int()` of a size (a Proxy has no value): it goes through torch.export."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)[:, : int(x.size(1))]


def test_exported_sdpa_view_runs_at_pp_tp_and_both(models_dir):
    """Traced through torch.export, `y.transpose(1, 2).contiguous().view(B, T, C)` records no copy
    (SDPA's CPU output was contiguous once transposed back); on `meta`, where the analysis runs, SDPA
    returns other strides and the bare view failed. Each plan against the untouched model."""
    loaded = load_model(f"{models_dir / 'attn_assert.py'}:build_exported")
    for plan in (Plan(pp=2), Plan(tp=2), Plan(pp=2, tp=2)):
        program, cmp = check_locally(loaded, plan)
        assert program.traced.tracer == "export"
        assert cmp.ok, (plan, cmp.failures)
        assert any(k.startswith("grad") for k in cmp.max_diff) and "loss" in cmp.max_diff
        if plan.tp > 1:
            assert program.param_shardings and any(k.endswith("(rank 1)") for k in cmp.max_diff)


class _MutatedBase(_Exported):
    def forward(self, x):
        h = super().forward(x)
        v = h.view(x.size(0), 2, 4)
        h.mul_(2)  # after the view: v sees the write through the storage they share
        return v + 1


def test_a_view_whose_base_is_written_later_stays_a_view():
    m, x = _MutatedBase(), torch.randn(3, 8)
    t = trace_model(m, (x,), {})
    assert t.tracer == "export"
    targets = [n.target for n in t.gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.view.default in targets and torch.ops.aten.reshape.default not in targets
    torch.testing.assert_close(t.unflatten_output(t.gm(x)), m(x), rtol=0, atol=0)


def test_views_of_unwritten_storage_become_reshapes():
    x = torch.randn(3, 8)

    class Viewed(_Exported):
        def forward(self, x):
            return super().forward(x).view(3, 2, 4).view(3, 8) * 2

    t = trace_model(Viewed(), (x,), {})
    assert t.tracer == "export"
    targets = [n.target for n in t.gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.view.default not in targets and targets.count(torch.ops.aten.reshape.default) == 2


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_tensor_filled_in_place_across_a_cut_is_sent_with_its_writes(models_dir, monkeypatch, tracer):
    """`filled = torch.zeros(...)` then `filled[:, i].copy_(...)` layer by layer: a stage after the cut
    used to recompute the zeros (a factory call on sizes looks free to recompute) and lost the
    writes made before the cut. Now the written storage is computed once and sent, at pp 2 and 3."""
    monkeypatch.setenv("FILLED_TRACER", tracer)
    loaded = load_model(str(models_dir / "filled_in_place.py"))
    for plan in (Plan(pp=2), Plan(pp=3, microbatches=1)):
        program, cmp = check_locally(loaded, plan)
        assert program.traced.tracer == tracer
        assert cmp.ok, (plan, cmp.failures)
        assert any(k.startswith("grad slots.0.weight") for k in cmp.max_diff), cmp.max_diff


def test_export_of_a_meta_model_leaves_a_shared_block_as_built(models_dir, monkeypatch):
    """torch's reparametrization restores a module reached under two names by one name only: the
    model kept fake CPU tensors after export and was no longer on meta (FEDformer's shared Fourier
    blocks), so the graph kept `device=cpu` factory calls and the analysis failed on them."""
    monkeypatch.setenv("FILLED_TRACER", "export")
    loaded = load_model(str(models_dir / "filled_in_place.py"))
    with torch.device("meta"):
        model = loaded.build()
    traced = trace_model(model, loaded.args, loaded.kwargs)
    assert traced.tracer == "export"
    assert all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    assert "device(type='cpu')" not in traced.gm.code


def test_a_loop_over_a_size_and_a_dict_keyed_by_ndim_are_traced_by_fx():
    """`for i in range(t)` over the sequence (makemore's GRU) is unrolled to the example's count and the
    count checked; `x.ndim` is a number (einops' layers key their recipes by it); both sent the model
    to torch.export before."""

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.GRUCell(4, 4)
            self.by_rank = {3: "b t c", 2: "b c"}

        def forward(self, x):
            assert self.by_rank[x.ndim] == "b t c"
            h = x.new_zeros(x.size(0), 4)
            for i in range(x.size(1)):
                h = self.cell(x[:, i], h)
            return h

    model, x = Recurrent(), torch.randn(2, 5, 4)
    traced = trace_model(model, (x,), {})
    assert traced.tracer == "fx", traced.reason
    torch.testing.assert_close(traced.gm(x)[0], model(x))
    with pytest.raises(AssertionError, match=r"test_trace\.py:\d+ in forward `for i in range\(x.size\(1\)\):` counted 5 on"):
        traced.gm(torch.randn(2, 6, 4))


def test_a_module_made_in_forward_is_traced_through_and_a_default_named_with_digits_is_baked():
    """litgpt's GPT makes `nn.Identity()` in forward as its head's clamp (a module with no weights, no
    submodule of the model: fx cannot call it by name), and takes `input_pos_maxp1=None`, a default whose
    name ends in digits (fx renames its placeholder `input_pos_maxp1_1`): both sent it to torch.export."""

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 3)

        def forward(self, x, input_pos_maxp1=None, chunk2=0):
            clamp = nn.Identity() if input_pos_maxp1 is None else nn.Tanh()
            return nn.Softmax(dim=-1)(clamp(self.proj(x))) + chunk2

    model, x = Head(), torch.randn(2, 4)
    traced = trace_model(model, (x,), {})
    assert traced.tracer == "fx", traced.reason
    assert not any(n.op == "call_module" and n.target != "proj" for n in traced.gm.graph.nodes)
    torch.testing.assert_close(traced.gm(x)[0], model(x))

    class MadeWithWeights(nn.Module):  # new weights each call: not traced through
        def forward(self, x):
            return nn.Linear(4, 3)(x)

    assert trace_model(MadeWithWeights(), (x,), {}).tracer != "fx"
