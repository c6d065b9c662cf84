"""HuggingFace GPT2LMHeadModel and LlamaForCausalLM, unmodified, from small configs:
traced through the torch.export fallback, split by tensor parallelism found from the
graph, and equal to the untouched model (the local backend: a thread per tp rank, real
collectives; tests/test_distributed.py runs tp on real processes)."""

import pytest

from graphsplit import Plan
from graphsplit.ir.sharding import Shard
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS, traced_once
from .test_tensor_parallel import compiled, per_block

pytest.importorskip("transformers")  # the test extras install it; skipped only without it

HF = {"gpt2": ("hf_gpt2.py", "transformer.h."), "llama": ("hf_llama.py", "model.layers.")}


@pytest.mark.parametrize("name", list(HF))
def test_hf_model_gets_megatron_plan(name):
    path, prefix = HF[name]
    program = compiled(MODELS / path, Plan(tp=2))
    assert program.traced.tracer == "export"
    assert program.replicated == [], program.replicated
    layers = {k: v for k, v in per_block(program).items() if k.startswith(prefix)}
    assert len(layers) == 2
    for counts in layers.values():
        assert counts == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}
    full = sum(p.numel() for p in load_model(str(MODELS / path)).build("meta").parameters()) * 4
    assert program.stage_param_bytes(0) < 0.6 * full


@pytest.mark.parametrize("name", list(HF))
@pytest.mark.parametrize("plan", [Plan(tp=2), Plan(tp=2, pp=2)], ids=["tp2", "tp2-pp2"])
def test_hf_model_matches_untouched_model(name, plan):
    loaded, traced = traced_once(MODELS / HF[name][0])  # one trace, both plans
    _, cmp = check_locally(loaded, plan, traced=traced)
    assert cmp.ok, cmp.failures
    assert any(k.endswith("(rank 1)") for k in cmp.max_diff), "both tp ranks' gradients were compared"


def test_hf_gpt2_with_its_real_vocabulary_of_50257_matches_untouched_model():
    """50257 is prime: the tied vocabulary is padded inside (25129 rows per rank, the last one
    padding), the user's model untouched, the logits the user sees 50257 wide."""
    program, cmp = check_locally(load_model(str(MODELS / "hf_gpt2_vocab.py")), Plan(tp=2))
    assert cmp.ok, cmp.failures
    assert program.param_shardings["transformer.wte.weight"] == Shard(0, size=50257)
    assert program.sharded_outputs == {0: Shard(2, size=50257)}  # vocab-parallel cross-entropy
    assert program.replicated == [], program.replicated
    assert {"grad transformer.wte.weight (rank 0)", "grad transformer.wte.weight (rank 1)", "output[0]"} <= set(cmp.max_diff)
