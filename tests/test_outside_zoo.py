"""Models written by others, copied unchanged (tests/models/outside/SOURCES.md), at pp 2, tp 2 and
pp 2 x tp 2 against the untouched model on the whole batch: loss, output and every rank's gradient
slice (the local backend; one trace per model). `python bench/outside_zoo.py` prints the table."""

import pytest

from graphsplit import Plan
from graphsplit.compile import trace_loaded
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS, traced_once

OUTSIDE = MODELS / "outside"
PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "pp2-tp2": Plan(pp=2, tp=2)}
# what each exercises: nanoGPT and minGPT their own loss, an assert on the sequence length, ModuleDict
# layers, a tied head (nanoGPT), dropout (minGPT); llama2.c RoPE tables, GQA, a tied head; mamba a Python
# loop over the sequence; nanochat value embeddings, x0 and scaled residuals, smear and backout, QK-norm,
# sliding windows, soft-capped logits, its own loss; FEDformer complex spectra and weights (torch.fft, cfloat
# einsums, in-place writes into a complex zeros tensor filled across a stage cut), one Fourier block shared
# by two layers, series decomposition, dropout; Informer random draws (torch.randint in ProbSparse
# attention), BatchNorm1d between encoder layers (compared per micro-batch), dropout; llama2.c of July 2023 a
# complex64 RoPE buffer (torch.polar) multiplied into view_as_complex'd queries and keys, its own loss, dropout;
# word_language_model seq-first tokens and targets (batch at dim 1); GAT no batch at all (one micro-batch)
MODELS_THAT_TRAIN = ["nanogpt", "mingpt", "llama2c", "llama2c_complex", "mamba", "nanochat", "tslib_fedformer",
                     "tslib_informer", "word_language_model", "gat"]


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


def test_the_seq_first_transformer_is_cut_along_its_batch_dim():
    """pytorch/examples' word_language_model: it takes len() of its input and caches the causal mask it
    builds on itself. torch.fx records the length as a checked constant (ir/size_conditions.py) and the
    model is left as it was; nn.TransformerEncoder, which looks at its mask's values, stays one module.
    It is sequence-first ([sequence, batch] tokens, an NLL over the flattened log-probabilities): the
    batch is found at dim 1 of the input and of the target, and micro-batches are cut there."""
    loaded, traced = traced_once(OUTSIDE / "word_language_model_tiny.py")
    assert traced.tracer == "fx" and "model.py:135" in traced.reason
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.inputs == {"src": 1} and program.batch.target == (1,)
    assert program.plan.num_microbatches == 2


def test_a_graph_network_has_no_batch_and_runs_as_one_micro_batch():
    """pytorch/examples' GAT: its nodes attend to their neighbours, so no input dim holds independent
    examples; the whole graph is one micro-batch through the pipeline."""
    loaded, traced = traced_once(OUTSIDE / "gat_tiny.py")
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert not program.batch.batched and program.plan.num_microbatches == 1
    assert program.batch.inputs == {"input_tensor": None, "adj_mat": None}


def test_a_model_that_reads_tensor_values_into_python_is_refused_in_one_line():
    """Time-Series-Library's TimesNet picks its periods from the data (`.cpu().numpy()` of an FFT's
    top-k): no one graph holds it. The line names the file, the function and the code."""
    loaded = load_model(str(OUTSIDE / "tslib_timesnet_tiny.py"))
    with pytest.raises(GraphsplitError) as exc:
        trace_loaded(loaded)
    message = str(exc.value)
    assert message.startswith("cannot trace Model at TimesNet.py:16 in FFT_for_Period: `top_list = top_list.detach()")
    assert "reads tensor values into Python" in message and "\n" not in message
