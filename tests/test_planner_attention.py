"""Attention priced as a GPU runs it (the fused kernel: q, k, v, the output and its log-sum-exp kept for
backward), whichever tracer made the graph: torch.fx calls `F.scaled_dot_product_attention`, an exported
graph its ATen op, and both were the math path's sequence x sequence probabilities on meta."""

from __future__ import annotations

import sys

import torch

from graphsplit import Plan
from graphsplit.ir.trace import trace_model
from graphsplit.loader import LoadedModel
from graphsplit.planner import profile_model

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "bench" / "models"))
from megatron_gpt import build_model  # noqa: E402

SEQ, HEADS = 256, 4


def _loaded() -> LoadedModel:
    tokens = torch.zeros(2, SEQ, dtype=torch.long)
    return LoadedModel(ROOT / "bench" / "models" / "megatron_gpt.py", "build_model",
                       lambda: build_model(layers=2, hidden=64, heads=HEADS, vocab=128, seq=SEQ), (tokens,), {},
                       lambda logits, target: torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()),
                       tokens)


def test_attention_in_an_exported_graph_is_priced_as_the_fused_kernel_keeps_it():
    loaded = _loaded()
    traced = trace_model(loaded.build("meta"), loaded.args, loaded.kwargs)
    # its attention's q, k, v come from iterating a split: torch.fx cannot, torch.export traces it
    assert any(n.target is torch.ops.aten.scaled_dot_product_attention.default for n in traced.gm.graph.nodes)
    square = HEADS * SEQ * SEQ  # one sample's probabilities, in elements
    for fused in (False, True):
        table = profile_model(loaded, (1,), fused).table(Plan(autocast="bf16"))
        per_sample = table.storage[0]
        quadratic = [int(b) for b in per_sample if b >= 2 * square]  # bf16 or fp32 probabilities
        assert bool(quadratic) is not fused, (fused, quadratic)
