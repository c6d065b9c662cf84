"""CTC (`F.ctc_loss`: speech and OCR models) trains split: torch has no meta kernel for CTC nor for a boolean
mask's selection, so the analysis registers their shapes while it runs, and only then (ir/meta_kernels.py);
the batch rule lines up each sample's log-probabilities with its lengths (analysis/batch/compute.py: ctc).
Checked against the untouched model on the whole batch at pp 2, tp 2 and dp 2 x pp 2 on a model written for
it (concatenated targets in `loss_fn`); HF's Wav2Vec2ForCTC, unchanged, is in the outside zoo."""

import pytest
import torch
import torch.nn.functional as F

from graphsplit import Plan
from graphsplit.launch.parity import check_locally

from .conftest import MODELS, traced_once

MODEL = MODELS / "ctc_asr.py"
PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "dp2-pp2": Plan(dp=2, pp=2)}


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_a_ctc_model_trains_as_the_untouched_one(plan):
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert any(k.startswith("grad conv.weight") for k in cmp.max_diff), cmp.max_diff


def test_the_batch_is_found_through_ctc():
    from graphsplit.rewrite import find_batch

    loaded, traced = traced_once(MODEL)
    found = find_batch(traced, traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.loss_fn, loaded.target)
    assert found.input_dims(traced.input_names) == [0] and found.size == 8
    assert found.target_dims(loaded.target) == [0]


def test_the_shapes_are_registered_only_while_graphsplit_analyses():
    from graphsplit.ir.devices import meta_sizes

    log_probs = torch.empty(10, 2, 5, device="meta")
    args = (log_probs, torch.empty(6, dtype=torch.long, device="meta"), torch.full((2,), 10, device="meta"),
            torch.full((2,), 3, device="meta"))
    with meta_sizes():
        assert F.ctc_loss(*args, reduction="none").shape == (2,)
        picked = torch.empty(4, 3, device="meta").masked_select(torch.empty(4, 3, dtype=torch.bool, device="meta"))
        assert picked.shape == (12,)  # at its largest
    with pytest.raises(NotImplementedError):
        F.ctc_loss(*args)  # torch's own behaviour outside: no kernel, the user's torch.compile unaffected


def test_a_torch_with_its_own_meta_kernel_for_ctc_is_left_its_own(monkeypatch):
    """torch 2.11's CUDA wheel has a meta kernel for `aten::_ctc_loss`, and its register_fake refuses to
    shadow one (every model failed to analyse on an H200 before this). Emulated here: register_fake
    raising as 2.11's does; graphsplit registers shapes only for the ops torch has none for."""
    from graphsplit.ir.devices import meta_sizes

    real = torch.library.register_fake

    def strict(name, fn, *, lib=None):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
            raise RuntimeError(f"register_fake(...): the operator {name} already has an DispatchKey::Meta implementation")
        return real(name, fn, lib=lib)

    monkeypatch.setattr(torch.library, "register_fake", strict)
    own = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - destroyed below
    own.impl("_ctc_loss_backward", lambda grad, log_probs, *rest: torch.empty_like(log_probs), "Meta")
    try:
        with meta_sizes():
            picked = torch.empty(4, 3, device="meta").masked_select(torch.empty(4, 3, dtype=torch.bool, device="meta"))
            assert picked.shape == (12,)
    finally:
        own._destroy()
