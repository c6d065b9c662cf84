"""Losses over tokens equal the whole batch's (issue 21, item 4): a mean over counted tokens (cross-entropy
with ignore_index, a masked mean), in loss_fn or inside the model, is normalized by the global count of
counted tokens, so with uneven padding the loss and every rank's gradient equal the untouched model's
on the whole batch at pp 2, dp 2, pp 2 x dp 2 and tp 2; where graphsplit cannot prove how a loss
reduces, run says how it combines the pieces."""

import dataclasses

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graphsplit import Plan
from graphsplit.analysis.loss_reduction import find_token_means
from graphsplit.launch.loss_combination import combination_notes
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.ops import tp as tpops
from graphsplit.ops.token_scale import token_scaled
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES, MODELS, traced_once

PLANS = {"pp2": Plan(pp=2), "dp2": Plan(dp=2), "pp2-dp2": Plan(pp=2, dp=2), "tp2-mb2": Plan(tp=2, microbatches=2)}


def test_a_mean_is_its_sum_over_the_counted_tokens_in_every_spelling():
    """What the rewrite relies on: reduction 'mean' = reduction 'sum' / (target != ignore_index).sum(),
    label smoothing included, for cross-entropy and NLL over tokens and over images (NLL 2d)."""
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(12, 5, generator=g), torch.randint(0, 5, (12,), generator=g)
    t[:7] = 3
    t[::2] = -1
    count = (t != -1).sum()
    for kwargs in ({}, {"label_smoothing": 0.2}):
        mean = F.cross_entropy(x, t, ignore_index=-1, **kwargs)
        total = F.cross_entropy(x, t, ignore_index=-1, reduction="sum", **kwargs)
        torch.testing.assert_close(mean, total / count)
    images, masks = torch.randn(2, 5, 3, 4, generator=g).log_softmax(1), torch.randint(0, 5, (2, 3, 4), generator=g)
    masks[0, :2] = -100
    torch.testing.assert_close(F.nll_loss(images, masks), F.nll_loss(images, masks, reduction="sum") / (masks != -100).sum())


@pytest.mark.parametrize("plan", list(PLANS))
def test_uneven_padding_equals_the_whole_batch(plan):
    """tests/models/ignore_index.py: the first half of the batch holds most of the padding."""
    loaded, traced = traced_once(MODELS / "ignore_index.py")
    program, cmp = check_locally(loaded, PLANS[plan], traced=traced)
    assert cmp.ok, cmp.failures
    assert [c.where for c in program.token_means.counts] == ["in loss_fn"]
    assert any(k.startswith("grad head.weight") for k in cmp.max_diff) and "loss" in cmp.max_diff
    assert combination_notes(program)[0].startswith("the cross-entropy in loss_fn is normalized by the tokens it "
                                                    "counts in the whole global batch")


def test_without_the_global_count_the_pieces_are_not_the_whole_batch(monkeypatch):
    """The test above can fail: with the mean left per piece, pp 2 gives another loss and gradients."""
    import graphsplit.rewrite as compile_module

    monkeypatch.setattr(compile_module, "PASSES", tuple(p for p in compile_module.PASSES if p[0] != "token_mean"))
    loaded, traced = traced_once(MODELS / "ignore_index.py")
    _, cmp = check_locally(loaded, Plan(pp=2), traced=traced)
    assert any(f.split(": ", 1)[-1].startswith("loss:") or f.startswith("loss:") for f in cmp.failures) and any("grad" in f for f in cmp.failures)


def _masked(tmp_path, loss):
    src = (MODELS / "ignore_index.py").read_text().split("def loss_fn")[0] + loss
    (tmp_path / "masked.py").write_text(src)
    return load_model(str(tmp_path / "masked.py"))


def test_a_masked_mean_equals_the_whole_batch(tmp_path):
    """sum(loss * mask) / mask.sum(), the mask computed from the target: its count is the mask's sum."""
    loaded = _masked(tmp_path, (
        "def loss_fn(output, target):\n"
        "    mask = (target != -100).float()\n"
        "    each = F.cross_entropy(output.flatten(0, 1), target.clamp(min=0).flatten(), reduction='none')\n"
        "    return (each * mask.flatten()).sum() / mask.sum()\n"))
    program, cmp = check_locally(loaded, Plan(pp=2, dp=2))
    assert cmp.ok, cmp.failures
    assert [(c.what, c.where) for c in program.token_means.counts] == [("masked mean", "in loss_fn")]


@pytest.mark.parametrize("loss, why", [
    ("F.cross_entropy(output.flatten(0, 1), target.flatten()) ** 2", "its value goes through pow"),
    ("F.cross_entropy(output.flatten(0, 1), target.flatten(), weight=torch.ones(32))", "it weighs classes"),
])
def test_a_mean_graphsplit_cannot_prove_is_said_and_left_as_it_is(tmp_path, loss, why):
    loaded = _masked(tmp_path, f"def loss_fn(output, target):\n    return {loss}\n")
    program = rewrite_loaded(loaded, Plan(pp=2)).program
    assert program.token_means.counts == () and program.loss_gm is None
    (note,) = combination_notes(program)
    assert note.startswith("the cross-entropy at ") and why in note, note
    assert note.endswith("the losses of the 2 pieces of the batch (micro-batches x replicas) are averaged as equals, "
                         "which is the whole batch's loss only when every piece counts as many tokens")


def test_hf_labels_with_padding_equal_the_whole_batch():
    """HF GPT-2 called with labels= shifts them inside the model (labels[..., 1:]) and averages its
    cross-entropy over the labels that are not -100: the count is that derivation run on the batch."""
    loaded, traced = traced_once(MODELS / "hf_gpt2_labels.py")
    labels = loaded.kwargs["labels"].clone()
    labels[0, 3:] = -100
    labels[1, 9:] = -100
    loaded = dataclasses.replace(loaded, kwargs={**loaded.kwargs, "labels": labels})
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced)
    assert cmp.ok, cmp.failures
    (count,) = program.token_means.counts
    assert count.where.startswith("at modeling_gpt2.py:") and count.reads == "inputs"
    assert token_scaled in {n.target for n in program.stages[-1].gm.graph.nodes}


@pytest.mark.parametrize("plan", [Plan(pp=2, dp=2), Plan(tp=2, dp=2)], ids=["pp2-dp2", "tp2-dp2"])
def test_an_outside_model_s_own_padded_loss_equals_the_whole_batch(plan):
    """nanoGPT, unchanged, computes its own cross-entropy with ignore_index=-1 on `targets`: the
    first sample mostly padding, the second half of it."""
    loaded = load_model(str(MODELS / "outside" / "nanogpt_tiny.py"))
    targets = loaded.kwargs["targets"].clone()
    targets[0, 2:], targets[1, 5:] = -1, -1
    loaded = dataclasses.replace(loaded, kwargs={**loaded.kwargs, "targets": targets})
    program, cmp = check_locally(loaded, plan)
    assert cmp.ok, cmp.failures
    assert program.token_means is not None and len(program.token_means.counts) == 1


def test_the_vocab_parallel_cross_entropy_sums_and_is_normalized():
    """tp 2 keeps the logits vocab-sharded into the loss: the rewritten loss graph's cross-entropy
    computes the sum there, and pp 2 x tp 2 with uneven padding equals the whole batch."""
    loaded, traced = traced_once(EXAMPLES / "gpt.py")
    target = loaded.target.clone()
    target[:3, 2:] = -100
    target[5, 10:] = -100
    program, cmp = check_locally(dataclasses.replace(loaded, target=target), Plan(pp=2, tp=2), traced=traced)
    assert cmp.ok, cmp.failures
    calls = [n for n in program.loss_gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls][-2:] == [tpops.vocab_parallel_cross_entropy, token_scaled]
    assert calls[-2].args[3] == "sum" and program.sharded_outputs


def test_counts_read_only_the_data():
    """A count that depends on the model's output or a parameter is not proven."""

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ignored", torch.tensor(-100))

        def forward(self, x, t):
            return F.cross_entropy(x, t) + F.cross_entropy(x, x.argmax(-1)) + F.cross_entropy(x, t.masked_fill(t == 0, self.ignored))

    from graphsplit.analysis.shapes import annotate

    gm = fx.symbolic_trace(Loss())
    annotate(gm, (torch.randn(6, 5), torch.randint(0, 5, (6,))))
    x, t = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = find_token_means(gm, data={t})
    assert [m.why_not for m in found] == ["", "its count depends on the model's output",
                                          "its count reads a parameter or buffer of the model"]
    assert int(found[0].count.gm(torch.tensor([1, -100, 2]))) == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_uneven_padding_passes_the_real_check_at_pp2_dp2():
    """4 gloo processes: each rank counts its replica's share and the dp group sums the counts; loss
    curve, gradient norms and weights after 2 steps equal the untouched model's on the whole batch."""
    from graphsplit.launch.launcher import RunOptions, run_training

    lines: list[str] = []
    cmp = run_training(str(MODELS / "ignore_index.py"), Plan(pp=2, dp=2), RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any(line.startswith("note: the cross-entropy in loss_fn is normalized") for line in lines), lines


@pytest.mark.parametrize("plan", [Plan(pp=2), Plan(dp=2, pp=2)], ids=["pp2", "dp2-pp2"])
def test_a_loss_summed_over_the_batch_is_the_sum_of_the_pieces(plan):
    """reduction='sum' (with class weights, in the model's own loss module): each piece sums its own
    samples and the pieces add up to the whole batch's sum, where averaging them as equals gave a
    1/pieces of it (loss and every gradient)."""
    loaded, traced = traced_once(MODELS / "summed_loss.py")
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert [c.what for c in program.token_means.counts] == ["summed cross-entropy"]
    assert any("sums over the whole global batch" in n for n in combination_notes(program))
