"""Models that compute their own loss train on it, with no loss_fn and no target (issue 21, item 2):
a scalar output, HF's `ModelOutput.loss` (`labels=`), hand-written GPTs' `(logits, loss)`; and a
`loss_fn(output)` without example_target(). Each against the untouched model on the whole batch."""

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutput

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded, trace_loaded
from graphsplit.runtime.training import default_loss, objective, own_loss

from .conftest import MODELS

OUTSIDE = MODELS / "outside"
logits = torch.randn(2, 3, 5)
loss = torch.tensor(1.5)


@pytest.mark.parametrize("output, where", [
    (loss, "output"),
    (CausalLMOutput(loss=loss, logits=logits), "output.loss"),
    ({"logits": logits, "loss": loss}, "output.loss"),
    ((logits, loss), "output[1]"),                      # nanoGPT, minGPT
    ((loss, logits), "output[0]"),                      # HF with return_dict=False
])
def test_the_models_own_loss_is_found_where_it_sits(output, where):
    found = own_loss(output)
    assert found is not None and found[0] == where and found[1] is loss
    assert default_loss(output) is loss


@pytest.mark.parametrize("output", [logits, (logits, logits), CausalLMOutput(loss=None, logits=logits),
                                    {"logits": logits}, (logits, torch.tensor(3))])
def test_an_output_without_a_floating_scalar_trains_on_the_mean_of_squares(output):
    assert own_loss(output) is None
    floats = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert torch.allclose(default_loss(output), sum(t.square().mean() for t in floats))


PLANS = [Plan(pp=2), Plan(tp=2), Plan(pp=2, tp=2)]


@pytest.fixture(scope="module")
def mingpt():
    loaded = load_model(str(OUTSIDE / "mingpt_tiny.py"))
    return loaded, trace_loaded(loaded)


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"pp{p.pp}-tp{p.tp}")
def test_mingpt_trains_on_its_own_loss_as_the_untouched_model(mingpt, plan):
    """karpathy/minGPT, unchanged: `logits, loss = model(idx, targets)`; no loss_fn, no target."""
    loaded, traced = mingpt
    assert loaded.loss_fn is None and loaded.target is None
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert "loss" in cmp.max_diff and cmp.max_diff["loss"] < 1e-5
    assert objective(program, None).startswith("the model's own loss (output[1])")


def test_hf_labels_train_on_output_loss():
    loaded = load_model(str(MODELS / "hf_gpt2_labels.py"))
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert cmp.ok, cmp.failures
    assert objective(program, None).startswith("the model's own loss (output.loss)")


def test_loss_fn_of_the_output_alone_needs_no_target():
    loaded = load_model(str(MODELS / "loss_output_only.py"))
    assert loaded.target is None
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert cmp.ok, cmp.failures
    assert objective(program, loaded.loss_fn) == "loss_fn"


def test_a_model_without_its_own_loss_says_what_it_trains_on():
    loaded = load_model(str(OUTSIDE / "mamba_tiny.py"))
    program = rewrite_loaded(loaded, Plan(pp=2)).program
    assert objective(program, loaded.loss_fn) == "loss_fn"
    assert objective(program, None).startswith("the mean of squares of the outputs")


@pytest.mark.slow
def test_hf_labels_on_real_processes(tmp_path):
    """pp 2 on 2 gloo processes: the last stage's scalar output is merged over the micro-batches as
    their mean (a batched merge would fail on a 0-dim tensor) and the loss is the model's own."""
    lines: list[str] = []
    cmp = run_training(str(MODELS / "hf_gpt2_labels.py"), Plan(pp=2),
                       RunOptions(steps=2, check=True, timeout_s=240), echo=lines.append)
    out = "\n".join(lines)
    assert cmp is not None and cmp.ok, out
    assert "training on the model's own loss (output.loss)" in out and "check passed" in out, out
