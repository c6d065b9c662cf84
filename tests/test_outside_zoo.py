"""Models written by others, copied unchanged (tests/models/outside/SOURCES.md), at pp 2, tp 2 and
pp 2 x tp 2 against the untouched model on the whole batch: loss, output and every rank's gradient
slice (the local backend; one trace per model). `python bench/outside_zoo.py` prints the table."""

import pytest

from graphsplit import Plan
from graphsplit.compile import trace_loaded
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS

OUTSIDE = MODELS / "outside"
PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "pp2-tp2": Plan(pp=2, tp=2)}
# what each exercises: nanoGPT and minGPT their own loss, an assert on the sequence length, ModuleDict
# layers, a tied head (nanoGPT), dropout (minGPT); llama2.c RoPE tables, GQA, a tied head; mamba a Python
# loop over the sequence; nanochat value embeddings, x0 and scaled residuals, smear and backout, QK-norm,
# sliding windows, soft-capped logits, its own loss; FEDformer complex spectra and weights (torch.fft, cfloat
# einsums, in-place writes into a complex zeros tensor filled across a stage cut), one Fourier block shared
# by two layers, series decomposition, dropout; Informer random draws (torch.randint in ProbSparse
# attention), BatchNorm1d between encoder layers (compared per micro-batch), dropout
MODELS_THAT_TRAIN = ["nanogpt", "mingpt", "llama2c", "mamba", "nanochat", "tslib_fedformer", "tslib_informer"]


@pytest.fixture(scope="module", params=MODELS_THAT_TRAIN)
def outside(request):
    loaded = load_model(str(OUTSIDE / f"{request.param}_tiny.py"))
    return request.param, loaded, trace_loaded(loaded)


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_an_unchanged_model_trains_as_the_untouched_one(outside, plan):
    name, loaded, traced = outside
    program, cmp = check_locally(loaded, plan, traced=traced.copy())
    assert cmp.ok, (name, cmp.failures)
    assert "loss" in cmp.max_diff and any(k.startswith("grad ") for k in cmp.max_diff), cmp.max_diff


def test_the_seq_first_transformer_is_refused_in_one_line():
    """pytorch/examples' word_language_model: nn.TransformerEncoder checks its mask's values
    (data-dependent for torch.export) and the model takes len() of its input (not traceable by fx)."""
    loaded = load_model(str(OUTSIDE / "word_language_model_tiny.py"))
    with pytest.raises(GraphsplitError) as exc:
        trace_loaded(loaded)
    assert str(exc.value).startswith("cannot trace TransformerModel")
    assert "\n" not in str(exc.value)


def test_a_model_that_reads_tensor_values_into_python_is_refused_in_one_line():
    """Time-Series-Library's TimesNet picks its periods from the data (`.cpu().numpy()` of an FFT's
    top-k): no one graph holds it. The line names the file, the function and the code."""
    loaded = load_model(str(OUTSIDE / "tslib_timesnet_tiny.py"))
    with pytest.raises(GraphsplitError) as exc:
        trace_loaded(loaded)
    message = str(exc.value)
    assert message.startswith("cannot trace Model at TimesNet.py:16 in FFT_for_Period: `top_list = top_list.detach()")
    assert "reads tensor values into Python" in message and "\n" not in message
