"""HuggingFace GPT2LMHeadModel and LlamaForCausalLM, unmodified, from small configs:
traced through the torch.export fallback, split by tensor parallelism found from the
graph, and equal to the untouched model on real gloo processes."""

import pytest

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training
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


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(HF))
def test_hf_model_tp2_matches_untouched_model(name):
    lines: list[str] = []
    cmp = run_training(str(MODELS / HF[name][0]), Plan(tp=2), RunOptions(steps=2, check=True, timeout_s=240), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
