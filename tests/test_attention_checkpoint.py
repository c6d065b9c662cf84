"""`--checkpoint attention`: only written-out attention's core recomputed (Megatron's selective recompute),
in the program and in the planner's price."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.attention_cores import attention_cores
from graphsplit.analysis.memory import gathered_dtype, saved_bytes
from graphsplit.ir.meta import info
from graphsplit.ir.op_kinds import OpKind, calls
from graphsplit.loader import load_model
from graphsplit.planner import load_hardware
from graphsplit.planner.profile import profile_model
from graphsplit.planner.stages import plan_stages
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES, MODELS

GPT = str(EXAMPLES / "gpt.py")
HF_GPT2 = str(MODELS / "hf_gpt2.py")


@pytest.fixture(scope="module")
def hf_eager():
    """HF's GPT2LMHeadModel with its eager attention (transformers' own `eager_attention_forward`)."""
    os.environ["HF_ATTN"] = "eager"
    try:
        return load_model(HF_GPT2)
    finally:
        del os.environ["HF_ATTN"]


@pytest.mark.parametrize("name", ["gpt", "hf"])
def test_each_written_out_attention_is_one_region_from_its_scores_to_its_values(name, hf_eager):
    loaded = load_model(GPT) if name == "gpt" else hf_eager
    blocks = 4 if name == "gpt" else 2
    program = rewrite_loaded(loaded, Plan(pp=2, checkpoint="attention")).program
    found = [st.gm.get_submodule(m) for st in program.stages for m, _ in st.gm.named_children() if m.startswith("ckpt_")]
    assert len(found) == blocks
    for region in found:
        ops = [n for n in region.inner.graph.nodes if n.op in ("call_function", "call_method")]
        matmuls = [n for n in ops if info(n).kind == OpKind.MATMUL]
        assert len(matmuls) == 2 and ops[0] is matmuls[0] and ops[-1] is matmuls[1]  # scores first, values last
        assert sum(calls(n, "softmax") for n in ops) == 1
        assert not any(info(n).kind == OpKind.LINEAR for n in ops)  # the projections keep their activations


def test_fused_attention_has_no_core_and_is_refused_in_one_line():
    llama = load_model(str(EXAMPLES / "llama.py"))
    assert attention_cores(rewrite_loaded(llama, Plan()).program.stages[0].gm) == []
    with pytest.raises(GraphsplitError, match="--checkpoint attention recomputes attention written out"):
        rewrite_loaded(llama, Plan(pp=2, checkpoint="attention"))
    from graphsplit.planner.price import price_plan

    profile = profile_model(llama, (2,))
    with pytest.raises(GraphsplitError, match="--checkpoint attention recomputes attention written out"):
        price_plan(profile, Plan(pp=2, checkpoint="attention"), load_hardware("h100"), 80 * 2**30, compare=False)
    with pytest.raises(GraphsplitError, match="FSDP's units"):
        Plan(dp=2, fsdp=True, checkpoint="attention")


@pytest.mark.parametrize("name", ["gpt", "hf"])
def test_the_planner_prices_what_the_cores_free(name, hf_eager):
    """Bytes kept for backward per stage, priced against analysis/memory.py's measurement of the compiled
    stages; between no checkpointing's and the blocks' recompute, and its recompute the cores' alone."""
    loaded = load_model(GPT) if name == "gpt" else hf_eager
    profile = profile_model(loaded, (1, 2))
    profile.hardware = load_hardware("cpu")
    for plan in (Plan(pp=2, checkpoint="attention"), Plan(tp=2, pp=2, checkpoint="attention")):
        predicted = plan_stages(profile, plan)
        program = rewrite_loaded(loaded, plan).program
        for st, want in zip(program.stages, predicted.saved_bytes):
            names = {id(st.gm.get_parameter(k)): c for k, c in st.param_sources.items()}
            got = saved_bytes(st.gm, st.input_examples(), plan.tp, True, program.param_shardings, names,
                              gathered_dtype(plan))
            assert abs(int(want) - got) <= 0.1 * got, (plan, int(want), got)
        plain, blocks = (plan_stages(profile, plan.replace(checkpoint=c)) for c in ("none", "blocks"))
        assert (blocks.saved_bytes < predicted.saved_bytes).all()
        assert (predicted.saved_bytes < plain.saved_bytes).all()
        assert (0 < predicted.recompute_seconds).all() and (predicted.recompute_seconds < blocks.recompute_seconds).all()


@pytest.mark.slow
def test_hf_eager_attention_recomputed_trains_as_the_untouched_model_on_real_processes(tmp_path):
    """transformers' GPT-2 with eager attention, unchanged, at pp 2 on 2 gloo processes (tp 2 x pp 2 on the
    local backend: below): `--check` compares loss, outputs and every rank's gradients with the untouched
    model on the whole batch."""
    r = subprocess.run([sys.executable, "-m", "graphsplit", "run", HF_GPT2, "--pp", "2",
                        "--checkpoint", "attention", "--steps", "1", "--check"], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", HF_ATTN="eager"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "check passed" in r.stdout


def test_the_search_tries_the_policy_where_the_model_has_written_out_attention():
    from collections import Counter

    from graphsplit.planner.search import candidates

    for path, has in ((GPT, True), (str(EXAMPLES / "llama.py"), False)):
        profile = profile_model(load_model(path), (2,))
        assert profile.has_cores is has
        left_out: Counter[str] = Counter()
        tried = {p.checkpoint for p in candidates(4, 4, 8, profile.max_stages, profile.has_blocks, left_out,
                                                  has_cores=profile.has_cores)}
        assert ("attention" in tried) is has and "selective" in tried


@pytest.mark.parametrize("name", ["gpt", "hf"])
def test_at_tp2_pp2_every_rank_gradient_is_the_untouched_models(name, hf_eager):
    """On the local backend (a thread per rank): the loss and each rank's gradient shards equal the untouched
    model's on the whole batch, fp32, with every attention core recomputed."""
    import torch

    from graphsplit.backends.local import LocalProgram
    from graphsplit.ir.sharding import shard_tensor
    from graphsplit.launch.reference import reference_step
    from graphsplit.runtime.materialize import model_tensors

    loaded = load_model(GPT) if name == "gpt" else hf_eager
    model = loaded.build("cpu", seed=0)
    program = rewrite_loaded(loaded, Plan(tp=2, pp=2, microbatches=2, checkpoint="attention")).program
    steps = LocalProgram(program, model_tensors(model), loaded.loss_fn).step(
        program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn)
    assert float(steps[0].loss) == pytest.approx(float(ref.loss), rel=1e-5)
    checked = 0
    for st in steps:
        for grad_name, grad in st.grads.items():
            want = shard_tensor(ref.grads[grad_name], program.param_sharding(grad_name), st.tp_rank, 2)
            torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5)
            checked += 1
    assert checked >= len(ref.grads)
