"""HuggingFace GPT2LMHeadModel and LlamaForCausalLM, unmodified, from small configs:
traced through the torch.export fallback, split by tensor parallelism found from the
graph, and equal to the untouched model (the local backend: a thread per tp rank, real
collectives; tests/test_distributed.py runs tp on real processes)."""

import pytest

from graphsplit import Plan
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS
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
    _, cmp = check_locally(load_model(str(MODELS / HF[name][0])), plan)
    assert cmp.ok, cmp.failures
    assert any(k.endswith("(rank 1)") for k in cmp.max_diff), "both tp ranks' gradients were compared"
