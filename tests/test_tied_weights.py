"""A weight a vocab-parallel embedding shards, read by anything else (issue 21, item 7): a tied LM
head under a loss other than the vocab-parallel cross-entropy, no loss at all, an odd vocabulary,
`x @ emb.weight.t()`, `F.linear(x, emb.weight)`, a regularizer on the weight; and an HF model's own
cross-entropy inside its graph, vocab-parallel. Every rank's gradient is its slice of the untouched model's."""

import pytest

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.rewrite import trace_loaded

from .conftest import MODELS

VARIANTS = ["mse", "default", "odd", "scaled_ce", "matmul", "flinear", "regularizer"]


@pytest.fixture
def variant(request, monkeypatch):
    monkeypatch.setenv("TIED_VARIANT", request.param)
    return request.param


@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
def test_a_tied_weight_is_read_as_the_ranks_hold_it(variant):
    loaded = load_model(str(MODELS / "tied_head.py"))
    traced = trace_loaded(loaded)
    for plan in (Plan(tp=2), Plan(pp=2, tp=2)):
        program, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, (variant, plan, cmp.failures)
        assert program.param_shardings.get("emb.weight") is not None  # vocab-parallel, not left whole
        assert "loss" in cmp.max_diff and any(k.startswith("grad emb.weight") for k in cmp.max_diff), cmp.max_diff


def test_an_hf_models_own_cross_entropy_is_vocab_parallel():
    """GPT-2 called with labels=: its head's logits feed its own cross-entropy inside the graph
    (torch.export's `cross_entropy_loss`, after HF's label shift), which becomes the vocab-parallel
    cross-entropy: the tied head reads its rows of the embedding sharded, nothing is left whole."""
    from graphsplit.ops import tp as tpops

    loaded = load_model(str(MODELS / "hf_gpt2_labels.py"))
    traced = trace_loaded(loaded)
    for plan in (Plan(tp=2), Plan(dp=2, pp=2, tp=2)):
        program, cmp = check_locally(loaded, plan, traced=traced.copy())
        assert cmp.ok, (plan, cmp.failures)
        assert program.replicated == [], program.replicated
        assert any(n.target is tpops.vocab_parallel_cross_entropy for st in program.stages for n in st.gm.graph.nodes)


@pytest.mark.slow
def test_tied_head_under_mse_on_real_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("TIED_VARIANT", "mse")
    lines: list[str] = []
    cmp = run_training(str(MODELS / "tied_head.py"), Plan(tp=2), RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)  # the ranks inherit TIED_VARIANT
