"""The tensor_parallel pass without processes: what it shards, the collectives it
inserts (Megatron's count), how it rewrites sizes, and what it refuses."""

import operator

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.collectives import collectives, count_table
from graphsplit.ir.sharding import S, Shard, local_shape, shard_tensor
from graphsplit.loader import load_model
from graphsplit.ops import tp as tpops
from graphsplit.ops.tp_comm import bind_tp_group, tp_comms
from graphsplit.rewrite import rewrite_loaded, rewrite_program
from graphsplit.runtime.materialize import materialize_stage, model_tensors

from .conftest import EXAMPLES, MODELS


def compiled(model_or_path, plan, args=None, kwargs=None):
    if isinstance(model_or_path, nn.Module):
        return rewrite_program(model_or_path, args, kwargs or {}, plan).program
    loaded = load_model(str(model_or_path))
    return rewrite_loaded(loaded, plan).program


def per_block(program):
    return count_table(collectives(st.gm.graph for st in program.stages))["per_block"]


@pytest.mark.parametrize("example, block_prefix, blocks", [("gpt.py", "h.", 4), ("llama.py", "layers.", 4), ("bert.py", "layers.", 4)])
def test_megatron_count_per_block_found_automatically(example, block_prefix, blocks):
    table = per_block(compiled(EXAMPLES / example, Plan(tp=2)))
    layers = {k: v for k, v in table.items() if k.startswith(block_prefix)}
    assert len(layers) == blocks
    for name, counts in layers.items():
        assert counts == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}, name


def test_vocab_parallel_embedding_costs_one_forward_all_reduce():
    table = per_block(compiled(EXAMPLES / "gpt.py", Plan(tp=2)))
    assert table["wte"] == {"forward": {"all_reduce": 1}, "backward": {}}
    assert table["wpe"] == {"forward": {"all_reduce": 1}, "backward": {}}


def test_weights_split_norms_replicated_and_qkv_chunked():
    program = compiled(EXAMPLES / "gpt.py", Plan(tp=2))
    sh = program.param_shardings
    assert sh["h.0.attn.c_attn.weight"] == S(0, (64, 64, 64))  # fused QKV: each rank its part of q, k and v
    assert sh["h.0.attn.c_proj.weight"] == S(1)  # row-parallel
    assert "h.0.attn.c_proj.bias" not in sh  # added once, after the reduction
    assert sh["wte.weight"] == S(0)  # vocab-parallel, and the tied LM head uses the same shard
    assert not any(k.endswith(("ln_1.weight", "ln_f.weight")) for k in sh)
    full = sum(p.numel() * 4 for p in load_model(str(EXAMPLES / "gpt.py")).build("meta").parameters())
    per_rank = program.stage_param_bytes(0)
    sharded = sum(
        st.gm.get_parameter(local).numel() * 4
        for st in program.stages
        for local, canonical in st.param_sources.items()
        if canonical in sh and local == canonical
    )
    assert per_rank == full - sharded // 2
    assert per_rank < 0.55 * full


def test_chunked_shard_takes_each_rank_part_of_every_chunk():
    full = torch.arange(12).reshape(12, 1)  # q = 0..3, k = 4..7, v = 8..11
    r0 = shard_tensor(full, S(0, (4, 4, 4)), 0, 2).flatten().tolist()
    r1 = shard_tensor(full, S(0, (4, 4, 4)), 1, 2).flatten().tolist()
    assert r0 == [0, 1, 4, 5, 8, 9] and r1 == [2, 3, 6, 7, 10, 11]


class Heads(nn.Module):
    """The same attention written three ways: sizes as constants, computed, and -1."""

    def __init__(self, style):
        super().__init__()
        self.style = style
        self.q = nn.Linear(32, 32)
        self.o = nn.Linear(32, 32)

    def forward(self, x):
        b, t, c = x.shape
        if self.style == "computed":
            h = self.q(x).view(b, t, 4, c // 4)
        elif self.style == "minus_one":
            h = self.q(x).view(b, t, -1, 8)
        else:
            h = self.q(x).view(2, 6, 4, 8)
        h = h.transpose(1, 2).softmax(-1).transpose(1, 2)
        return self.o(h.reshape(b, t, c))


@pytest.mark.parametrize("style", ["constant", "computed", "minus_one"])
def test_view_sizes_rewritten_in_all_three_forms(style):
    program = compiled(Heads(style), Plan(tp=2), (torch.randn(2, 6, 32),))
    graph = program.stages[0].gm.graph
    view = next(n for n in graph.nodes if n.op == "call_method" and n.target == "view")
    sizes = list(view.args[1:])
    if style == "constant":
        assert sizes == [2, 6, 2, 8]  # 4 heads -> 2 per rank
    elif style == "minus_one":
        assert sizes[2:] == [-1, 8]  # -1 infers the local head count by itself
    else:
        assert sizes[2] == 2
        assert isinstance(sizes[3], torch.fx.Node) and sizes[3].target is operator.floordiv
    reshape = next(n for n in graph.nodes if n.op == "call_method" and n.target == "reshape")
    c = reshape.args[3]
    assert isinstance(c, torch.fx.Node) and c.target is operator.floordiv and c.args[1] == 2
    counts = count_table(collectives([graph]))["total"]
    assert counts["forward"] == {"all_reduce": 1}
    assert counts["backward"] == {}  # the input needs no gradient, so f is left out


def test_runtime_collectives_match_the_static_count():
    """Run rank 0's program forward and backward on a fake process group and count calls."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    loaded = load_model(str(EXAMPLES / "llama.py"))
    program = compiled(EXAMPLES / "llama.py", Plan(tp=2))
    model = loaded.build("cpu", seed=0)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        stage = materialize_stage(program.stages[0], "cpu", model_tensors(model), 0, program.param_shardings, 0, 2)
        bind_tp_group(stage, dist.group.WORLD)
        out = stage(*program.traced.flatten_inputs(loaded.args, loaded.kwargs))
        out.float().pow(2).mean().backward()
        (comm,) = tp_comms(stage)
        runtime = {d: {k: n for (dd, k), n in comm.counts.items() if dd == d} for d in ("forward", "backward")}
    finally:
        dist.destroy_process_group()
    static = count_table(collectives(st.gm.graph for st in program.stages))["total"]
    assert runtime == static
    assert runtime["forward"]["all_reduce"] == 2 * 4 + 1


def test_gqa_kv_heads_stay_replicated_when_tp_does_not_divide_them():
    program = compiled(EXAMPLES / "llama.py", Plan(tp=4))  # 4 query heads, 2 kv heads
    sh = program.param_shardings
    assert sh["layers.0.attention.wq.weight"] == S(0)
    assert "layers.0.attention.wk.weight" not in sh and "layers.0.attention.wv.weight" not in sh
    reasons = [r for r in program.replicated if r["module"] == "layers.0.attention.wk"]
    assert reasons and "cannot be split over tp=4" in reasons[0]["reason"]


def test_tp_not_dividing_heads_names_module_and_suggests_tp():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(36, 36)
            self.o = nn.Linear(36, 36)

        def forward(self, x):
            b, t, c = x.shape
            h = self.q(x).view(b, t, 6, 6).transpose(1, 2).softmax(-1)
            return self.o(h.transpose(1, 2).reshape(b, t, c))

    with pytest.raises(GraphsplitError, match=r"'q': 6 heads cannot be split over tp=4; use tp=3"):
        compiled(Attn(), Plan(tp=4), (torch.randn(2, 5, 36),))


@pytest.mark.parametrize("spec", ["odd_vocab.py", "odd_vocab.py:build_untied"])
def test_a_vocabulary_tp_does_not_divide_is_padded_inside(spec):
    """97 rows at tp 2: each rank holds 49, the last one zero padding row; the logits stay
    sharded into a cross-entropy told the real vocabulary, and nothing gathers them."""
    program = compiled(f"{MODELS / spec}", Plan(tp=2))
    head = "wte.weight" if spec == "odd_vocab.py" else "lm_head.weight"
    assert program.param_shardings[head] == Shard(0, size=97)
    if head == "lm_head.weight":
        assert program.param_shardings["lm_head.bias"] == Shard(0, size=97)
        assert program.param_shardings["wte.weight"] == S(1)  # an input embedding of its own splits its width
    assert program.sharded_outputs == {0: Shard(2, size=97)}
    gathers = [n for n in program.stages[-1].gm.graph.nodes if n.target is tpops.gather_from_tp]
    assert not [n for n in gathers if "size" in n.kwargs], "the logits are not gathered"
    (ce,) = [n for n in program.loss_gm.graph.nodes if n.target is tpops.vocab_parallel_cross_entropy]
    assert ce.kwargs == {"vocab": 97}
    assert local_shape((97, 64), program.param_shardings[head], 2) == (49, 64)


def test_heads_tp_does_not_divide_stay_refused_whatever_the_vocabulary():
    """The vocabulary is padded, heads are not (Megatron refuses them too)."""
    with pytest.raises(GraphsplitError, match=r"4 heads cannot be split over tp=3; use tp=4"):
        compiled(EXAMPLES / "gpt.py", Plan(tp=3))


def test_unsplittable_layers_are_reported_with_a_reason():
    program = compiled(EXAMPLES / "bert.py", Plan(tp=2))
    assert any(r["module"] == "transform" and "norm" in r["reason"] for r in program.replicated)


def test_cross_entropy_loss_keeps_logits_sharded():
    from graphsplit.ops.tp import gather_from_tp, vocab_parallel_cross_entropy

    program = compiled(EXAMPLES / "gpt.py", Plan(tp=2))
    last = program.stages[-1].gm.graph
    assert not any(n.target is gather_from_tp for n in last.nodes), "the logits are not gathered"
    assert program.sharded_outputs == {0: S(2)}
    assert any(n.target is vocab_parallel_cross_entropy for n in program.loss_gm.graph.nodes)


def test_other_losses_get_whole_logits():
    from graphsplit.ops.tp import gather_from_tp

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.head = nn.Linear(16, 8)  # column-parallel: its output is sharded

        def forward(self, x):
            return self.head(self.norm(x))

    x, y = torch.randn(4, 16), torch.randn(4, 8)
    program = rewrite_program(Head(), (x,), {}, Plan(tp=2), loss_fn=nn.functional.mse_loss, target=y).program
    assert program.param_shardings["head.weight"] == S(0)
    assert program.loss_gm is None and not program.sharded_outputs  # MSE needs the whole output
    assert any(n.target is gather_from_tp for n in program.stages[-1].gm.graph.nodes)


def test_export_spellings_keep_the_plan():
    """HF-style code traced by torch.export: aten.slice in RoPE keeps the head shard, and a
    fused QKV behind a view (HF's Conv1D) is still sharded chunk by chunk."""
    from .conftest import MODELS

    sliced = compiled(MODELS / "hf_export_slice.py", Plan(tp=2))
    assert sliced.traced.tracer == "export" and sliced.replicated == []
    fused = compiled(MODELS / "hf_fused_qkv_view.py", Plan(tp=2))
    assert fused.replicated == []
    assert fused.param_shardings["w_attn"] == S(1, (32, 32, 32))
