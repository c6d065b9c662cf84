"""Models written by others, copied unchanged (tests/models/outside/SOURCES.md), against the untouched
model on the whole batch: loss, output and every rank's gradient slice. Each model at tp 2 and
dp 2 x pp 2 on the local backend (one trace per model) and at pp 2 on real processes
(`graphsplit run --check`, tests/test_outside_zoo_processes.py; dp 2 x pp 2 there for a loss that couples the samples). A first run ends in one of three ways: it trains as the untouched
model, it is refused in one line naming the code, or it says why it differs; never a traceback.
The table below is every `*_tiny.py` file (a new one must be put in it), and README.md's share of
the zoo that trains at every plan is counted from it. `python bench/outside_zoo.py` prints it."""

import re

import pytest

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.rewrite import trace_loaded

from .conftest import MODELS, ROOT, traced_once

OUTSIDE = MODELS / "outside"
LOCAL_PLANS = {"tp2": Plan(tp=2), "dp2-pp2": Plan(dp=2, pp=2)}
# what each exercises is in its *_tiny.py file's docstring
TRAINS = [
    "nanogpt", "mingpt", "llama2c", "llama2c_complex", "mamba", "nanochat", "tslib_fedformer", "tslib_informer",
    "word_language_model", "cifar_resnet18", "cifar_mobilenetv2", "cifar_shufflenetv2", "vit", "vit_mae", "whisper",
    "efficientnet", "entmax", "dann", "loralib_gpt2", "peft_llama_lora", "peft_gpt2_lora", "t5_labels",
    "improved_diffusion", "mistral_moe", "x_transformers", "rasbt_gpt", "rasbt_llama32", "makemore_mlp", "makemore_gru",
    "mlp_mixer", "ncf_neumf", "open_clip_rn", "open_clip",
    "minimind", "improved_diffusion_ckpt", "wav2vec2_ctc", "clip", "hf_clip", "dlrm", "fast_neural_style",
    "attention_is_all_you_need", "tslib_patchtst", "tslib_itransformer", "tslib_dlinear", "tslib_crossformer",
    "tslib_segrnn", "tslib_film", "tslib_lightts", "tslib_pattn", "tslib_scinet", "tslib_tide", "tslib_transformer",
    "tslib_tsmixer", "tslib_frets", "tslib_nonstationary_transformer", "tslib_timexer", "lucidrains_moe", "litgpt",
    "perceiver",
]
# their loss couples the samples (open_clip's ClipLoss) or their own tail does (openai's CLIP makes the image x
# text logits, HF's CLIPModel also its contrastive loss): under dp every replica gathers the replicas' outputs
# or the tail's inputs, which the local backend (replicas one after the other) cannot: their dp 2 x pp 2 runs
# on real processes
WHOLE_BATCH_LOSS = {"open_clip", "open_clip_rn", "clip", "hf_clip"}
# trains at the plans not named here; refused at these, in one line starting so
REFUSED_AT = {
    # its nodes attend to each other: no dim holds independent examples
    ("gat", "dp2-pp2"): "the inputs cannot be cut into 2 replica(s) x 2 micro-batch(es): no batch: dim 0 of 'input_tensor'",
    # its codebook's EMA sums the whole batch's code assignments in forward, as BatchNorm's statistics do
    ("vq_autoencoder", "dp2-pp2"): "the inputs cannot be cut into 2 replica(s) x 2 micro-batch(es): no batch: dim 0 of "
                                   "'x': sum over it at vector_quantize_pytorch.py:602 in track_cluster_size_and_embed_avg",
    # its balancing loss is a mean over every token of the batch, computed inside the experts' layer, which
    # runs as written (`if mask.any():`), and it picks each expert's weights with a mask over the flattened
    # tokens and their top-k slots (`topk_weight[mask]`), the first such op the discovery names: no dp
    ("minimind_moe", "dp2-pp2"): "the inputs cannot be cut into 2 replica(s) x 2 micro-batch(es): no batch: dim 0 of "
                                 "'input_ids': index.Tensor at model_minimind.py:167 in forward",
    # picks its periods from the whole batch's mean spectrum, into NumPy: its blocks run as written, and
    # every sample's periods follow the others'
    ("tslib_timesnet", "dp2-pp2"): "the inputs cannot be cut into 2 replica(s) x 2 micro-batch(es): no batch: dim 0 "
                                   "of 'x_enc': mean over it at TimesNet.py:13 in FFT_for_Period",
}
PARTLY = sorted({name for name, _ in REFUSED_AT})
# refused whole, in one line naming the code
REFUSED = {
    # a sparse adjacency: torch has no meta kernel for sparse mm (traces, refused at every plan)
    "pygcn": "mm in module 'gc1' at layers.py:33 in forward takes a sparse tensor",
}


def test_the_table_holds_every_outside_model_once():
    on_disk = {p.name.removesuffix("_tiny.py") for p in OUTSIDE.glob("*_tiny.py")}
    listed = [*TRAINS, *PARTLY, *REFUSED]
    assert sorted(listed) == sorted(on_disk), "put each outside model in exactly one of TRAINS, REFUSED_AT, REFUSED"


def test_readme_gives_the_share_the_table_measures():
    """README.md's count of the outside zoo that trains at every plan is this table's, which the tests
    below hold to."""
    total = len(TRAINS) + len(PARTLY) + len(REFUSED)
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"(\d+) of the (\d+) models of the outside zoo train at every plan", readme)
    assert found is not None, "README.md must say how many outside models train at every plan"
    assert (int(found[1]), int(found[2])) == (len(TRAINS), total)


CASES = [(name, plan) for name in [*TRAINS, *PARTLY] for plan in LOCAL_PLANS if (name, plan) not in REFUSED_AT
         and not (name in WHOLE_BATCH_LOSS and plan == "dp2-pp2")]


@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_an_unchanged_model_trains_as_the_untouched_one(name, plan):
    loaded, traced = traced_once(OUTSIDE / f"{name}_tiny.py")
    program, cmp = check_locally(loaded, LOCAL_PLANS[plan], traced=traced.copy())
    assert cmp.ok, (name, cmp.failures)
    assert "loss" in cmp.max_diff and any(k.startswith("grad ") for k in cmp.max_diff), cmp.max_diff


@pytest.mark.parametrize("name, plan", list(REFUSED_AT), ids=[f"{n}-{p}" for n, p in REFUSED_AT])
def test_a_plan_a_model_cannot_take_is_refused_in_one_line(name, plan):
    loaded, traced = traced_once(OUTSIDE / f"{name}_tiny.py")
    with pytest.raises(GraphsplitError) as exc:
        check_locally(loaded, LOCAL_PLANS[plan], traced=traced.copy())
    assert str(exc.value).startswith(REFUSED_AT[name, plan]), str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_model_graphsplit_cannot_split_is_refused_in_one_line(name):
    loaded = load_model(str(OUTSIDE / f"{name}_tiny.py"))
    with pytest.raises(GraphsplitError) as exc:  # by the tracer, or at the plan's compile
        check_locally(loaded, Plan(pp=2), traced=trace_loaded(loaded))
    assert str(exc.value).startswith(REFUSED[name]), str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name", sorted(WHOLE_BATCH_LOSS))
def test_the_local_backend_sends_a_whole_batch_loss_under_dp_to_real_processes(name):
    loaded, traced = traced_once(OUTSIDE / f"{name}_tiny.py")
    with pytest.raises(GraphsplitError, match="the local backend runs dp replicas one after the other, and the "
                                              "(loss|model's tail) couples the samples"):
        check_locally(loaded, LOCAL_PLANS["dp2-pp2"], traced=traced.copy())


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


@pytest.mark.parametrize("name, sharded, nothing_whole", [
    # Time-Series-Library's attention, `einsum("blhe,bshe->bhls", q, k)`: sharded by heads through the einsums
    ("tslib_itransformer", ["encoder.attn_layers.0.attention.query_projection.weight",
                            "encoder.attn_layers.0.attention.out_projection.weight"], False),
    # whisper's Linear casts its weight in forward (`self.weight.to(x.dtype)`): sharded as the parameter
    ("whisper", ["encoder.blocks.0.attn.query.weight", "encoder.blocks.0.mlp.2.weight"], True),
    # nanoGPT's own cross-entropy in its forward: its LM head's logits stay sharded into it (vocab-parallel)
    ("nanogpt", ["transformer.h.0.attn.c_attn.weight"], True),
], ids=["einsum attention", "weights cast in forward", "own loss"])
def test_outside_models_that_were_left_whole_under_tp_are_sharded(name, sharded, nothing_whole):
    """Code others wrote, parts of which tp left whole until 2026-12-07 (correct, not split): now sharded
    as Megatron would, and equal to the untouched model."""
    from graphsplit.ops import tp as tpops

    loaded, traced = traced_once(OUTSIDE / f"{name}_tiny.py")
    program, cmp = check_locally(loaded, Plan(tp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    for param in sharded:
        assert program.param_sharding(param) is not None, (param, program.replicated)
    assert (program.replicated == []) == nothing_whole, program.replicated
    if name == "nanogpt":
        assert any(n.target is tpops.vocab_parallel_cross_entropy for st in program.stages for n in st.gm.graph.nodes)
