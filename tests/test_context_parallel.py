"""Context parallelism's attention exchange (ops/context_parallel.py) on real processes: each rank's queries over the
whole sequence equal the untouched attention's rows for its positions, and every rank's gradients of
its q, k and v shards equal the matching slices of the whole gradients (causal and not, grouped-query).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from graphsplit import Plan
from graphsplit.ops.context_parallel import (
    CPComm,
    cp_attention,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)

CP, BATCH, HEADS, KV_HEADS, LENGTH, DIM = 2, 2, 4, 2, 16, 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _whole(seed: int, heads: int) -> torch.Tensor:
    return torch.randn(BATCH, heads, LENGTH, DIM, generator=torch.Generator().manual_seed(seed))


def _attention_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=CP, timeout=timedelta(seconds=60))
    try:
        comm = CPComm(CP)
        comm.bind(dist.group.WORLD)
        results = {}
        for causal in (True, False):
            q, k, v = (shard_sequence(_whole(s, h), 2, rank, CP).requires_grad_(True)
                       for s, h in ((0, HEADS), (1, KV_HEADS), (2, KV_HEADS)))
            y = cp_attention(q, k, v, comm, is_causal=causal, enable_gqa=True)
            # a loss that weighs each output element differently, cut like the outputs
            (y * shard_sequence(_whole(3, HEADS), 2, rank, CP)).sum().backward()
            results[causal] = [t.detach().clone() for t in (y, q.grad, k.grad, v.grad)]
        out[rank] = results
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_attention_over_the_gathered_sequence_equals_the_whole_attention():
    out = mp.Manager().dict()
    mp.spawn(_attention_worker, args=(_free_port(), out), nprocs=CP, join=True)
    for causal in (True, False):
        q, k, v = (_whole(s, h).requires_grad_(True) for s, h in ((0, HEADS), (1, KV_HEADS), (2, KV_HEADS)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        (y * _whole(3, HEADS)).sum().backward()
        for i, whole in enumerate((y, q.grad, k.grad, v.grad)):
            got = unshard_sequence([out[r][causal][i] for r in range(CP)], 2)
            torch.testing.assert_close(got, whole.detach(), rtol=1e-5, atol=1e-6)


def test_load_balanced_shards_hold_chunks_r_and_2cp_minus_1_minus_r():
    assert shard_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert shard_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    x = torch.arange(24).view(2, 12)
    shards = [shard_sequence(x, 1, r, 3) for r in range(3)]
    assert shards[2].tolist() == [[4, 5, 6, 7], [16, 17, 18, 19]]
    assert torch.equal(unshard_sequence(shards, 1), x)
    with pytest.raises(ValueError, match="4 chunks; 6 tokens do not divide"):
        shard_positions(6, 0, 2)


def test_unbound_attention_is_the_models_own():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    torch.testing.assert_close(cp_attention(q, k, v, CPComm(2), is_causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_grouped_query_keys_are_gathered_before_their_repeat():
    """The rewrite hands attention the key/value heads (2 of 4 heads in the Llama example's
    repeat_interleave and HF Llama's repeat_kv; through autocast's cast under bf16), so the exchange
    moves them and not their copies; unbound, the call repeats them itself and equals the model's SDPA."""
    from graphsplit.ir.meta import info
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded

    from .conftest import EXAMPLES, MODELS

    for path, layers in ((EXAMPLES / "llama.py", 4), (MODELS / "hf_llama.py", 2)):  # repeat_interleave; HF's repeat_kv
        loaded = load_model(str(path))
        for plan in (Plan(dp=2, cp=2), Plan(dp=2, cp=2, tp=2, autocast="bf16")):
            program = rewrite_loaded(loaded, plan).program
            calls = [n for s in program.stages for n in s.gm.graph.nodes if n.target is cp_attention]
            assert len(calls) == layers and all(n.kwargs["kv_repeat"] == 2 for n in calls)
            heads = [tuple(info(x).tensor.shape)[1] for n in calls for x in n.args[:3]]
            assert heads == [4 // plan.tp, 2 // plan.tp, 2 // plan.tp] * layers, heads  # q's heads, then k's and v's
    q, k, v = torch.randn(1, 4, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
    torch.testing.assert_close(cp_attention(q, k, v, CPComm(2), is_causal=True, kv_repeat=2),
                               F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                              is_causal=True))


def test_attention_in_sdpa_form_computes_what_the_model_computes():
    """nanoGPT's written-out attention (the GPT example: its tril buffer read from the constructor, its
    scale from k.size(-1)) becomes one causal SDPA call per layer, and HF Llama's mask built from
    positions under torch.export becomes SDPA's is_causal; no softmax or mask build is left, and the
    GPT graph computes the untouched model's logits."""
    from graphsplit.analysis.shapes import annotate
    from graphsplit.loader import load_model
    from graphsplit.passes.attention_form import attention_form
    from graphsplit.rewrite import trace_loaded
    from graphsplit.runtime.materialize import model_tensors

    from .conftest import EXAMPLES, MODELS

    for path, layers in ((EXAMPLES / "gpt.py", 4), (MODELS / "hf_llama.py", 2)):
        loaded = load_model(str(path))
        traced = trace_loaded(loaded)
        flat = traced.flatten_inputs(loaded.args, loaded.kwargs)
        annotate(traced.gm, tuple(flat))
        buffers = dict(loaded.build_buffers_only().named_buffers())
        assert attention_form(traced.gm, traced.input_names, flat, lambda found=buffers: found) == layers
        calls = [n for n in traced.gm.graph.nodes if n.op == "call_function" and "scaled_dot_product" in str(n.target)]
        assert len(calls) == layers and all(n.kwargs.get("is_causal") and len(n.args) == 3 for n in calls)
        assert not any("softmax" in str(n.target) or "diff" in str(n.target) for n in traced.gm.graph.nodes)
        if traced.tracer == "export":  # its numbers: the cp 2 x tp 2 run below, against the untouched model
            continue
        model = loaded.build("cpu", seed=0)
        got = torch.func.functional_call(traced.gm, model_tensors(model), tuple(flat))
        got = got[0] if isinstance(got, tuple | list) else got
        want = model(*loaded.args, **loaded.kwargs)
        want = want.logits if hasattr(want, "logits") else want
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_batch_discovery_finds_the_sequence_attention_mixes():
    """Where every input, the target and the output hold the sequence: what --cp cuts and joins."""
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded

    from .conftest import EXAMPLES

    program = rewrite_loaded(load_model(str(EXAMPLES / "llama.py")), Plan()).program
    seq = program.batch.sequence
    assert seq is not None and (seq.inputs, seq.target, seq.outputs, seq.length, seq.merged) == \
        ({"idx": 1}, (1,), (1,), 32, ())
    nodes = {n.name: n for n in program.traced.gm.graph.nodes}
    assert {nodes[n].target for n, _ in seq.mixers if n} == {F.scaled_dot_product_attention}  # only attention mixes it


REAL = [("models", "llama_data.py", Plan(dp=2, cp=2, tp=2, pp=2)),  # the Llama example fed by train_data()
        # nanoGPT's attention written out (q @ k^T, a tril buffer sliced to T, softmax, @ v): one SDPA call
        ("examples", "gpt.py", Plan(dp=2, cp=2, pp=2)),
        # HF's LlamaForCausalLM unmodified, through torch.export: its mask built from positions becomes
        # SDPA's is_causal, its position ids this rank's global positions; with FSDP, each checkpointed
        # block a unit of its own (the planner's plan for Llama 3 70B at 131K tokens)
        ("models", "hf_llama.py", Plan(dp=2, cp=2, tp=2, fsdp=True, checkpoint="blocks"))]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where, name, plan", REAL, ids=[f"{n.removesuffix('.py')}-cp{p.cp}-tp{p.tp}-pp{p.pp}"
                                                         for _, n, p in REAL])
def test_cp_composes_with_tp_and_pp_on_real_processes_and_matches_the_untouched_model(where, name, plan):
    """`run --check` at cp 2 x tp 2 (x pp 2: 8 processes): each pair of dp ranks holds one sample
    replica, each its load-balanced half of every sequence; loss, logits (the halves put back in
    order) and every rank's gradients equal the untouched model's on the whole batch, over 2 steps
    (the Llama example's from train_data(), with eval_data() after each step)."""
    from graphsplit.launch.launcher import RunOptions, run_training

    from .conftest import EXAMPLES, MODELS

    lines: list[str] = []
    path = (EXAMPLES if where == "examples" else MODELS) / name
    data = name == "llama_data.py"  # train_data() and eval_data(): each rank its replica's share, its shard
    cmp = run_training(str(path), plan, RunOptions(steps=2, check=True, timeout_s=240, eval_every=1 if data else 0),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("each sequence cut over 2 ranks" in line for line in lines), lines
    assert any("on the whole global batch" in line for line in lines)
    ranks = {int(k.rsplit("(rank ", 1)[1].rstrip(")")) for k in cmp.max_diff if k.startswith("grad")}
    assert ranks == set(range(plan.world_size)), "every rank's gradients compared"
    assert lines[-1].startswith("check passed")
    assert any(line.startswith("  eval loss     2 evaluations") for line in lines) == data, lines


def test_refusals_are_one_line_each():
    """Attention written out with a mask that is not causal (a sliding window, named with its line),
    a model with no SDPA call (the MLP example: the dim it would cut named with its mixer), HF Llama
    given a padding mask (attention_mask: computed from the inputs), HF GPT-2's labels= (shifted inside
    the model: not cut with the tokens), a position
    table read in a spelling graphsplit does not rewrite (each rank would add positions 0..), a sequence cp does not cut into 2 x cp chunks, cp not dividing dp, cp with ep, the
    local backend: each one line."""
    from graphsplit.errors import GraphsplitError
    from graphsplit.launch.parity import check_locally
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded

    from .conftest import EXAMPLES, MODELS

    with pytest.raises(GraphsplitError, match=r"--cp: the attention mask at window_attention\.py:29 in forward is a "
                                              r"sliding window of 4 tokens; context parallelism masks by global "
                                              r"position, causally or not at all"):
        rewrite_loaded(load_model(str(MODELS / "window_attention.py")), Plan(dp=2, cp=2))
    with pytest.raises(GraphsplitError, match=r"--cp: no F.scaled_dot_product_attention call mixes the inputs' dims \(the "
                                              r"one context parallelism would cut is mixed: a matmul contracts it in "
                                              r"module inp at mlp\.py:19"):
        rewrite_loaded(load_model(str(EXAMPLES / "mlp.py")), Plan(dp=2, cp=2))
    with pytest.raises(GraphsplitError, match=r"--cp: the attention call at modeling_llama\.py:\d+ in forward takes a mask "
                                              r"computed from the inputs \(a padding mask such as attention_mask\)"):
        rewrite_loaded(load_model(str(MODELS / "hf_llama_padded.py")), Plan(dp=2, cp=2))
    with pytest.raises(GraphsplitError, match=r"--cp 2: input 'labels' dim 1 holds 16 tokens but not as the sequence "
                                              r"attention mixes .*give shifted targets to loss_fn"):
        rewrite_loaded(load_model(str(MODELS / "hf_gpt2_labels.py")), Plan(dp=2, cp=2))
    # the safety net: a position table read with `narrow` (not rewritten) would give each rank positions 0..
    with pytest.raises(GraphsplitError, match=r"--cp 2: a value with a dim of the sequence's 16 tokens is built from "
                                              r"sizes and buffers alone at narrow_positions\.py:31"):
        rewrite_loaded(load_model(str(MODELS / "narrow_positions.py")), Plan(dp=2, cp=2))
    llama = load_model(str(EXAMPLES / "llama.py"))
    with pytest.raises(GraphsplitError, match=r"--cp 3: the sequence of 32 tokens \(input 'idx' dim 1\) cannot be cut "
                                              r"into 6 equal chunks.*--cp 2, 4, 8, 16"):
        rewrite_loaded(llama, Plan(dp=3, cp=3))
    with pytest.raises(GraphsplitError, match="cp must divide dp; got cp=2 with dp=3"):
        Plan(dp=3, cp=2)
    with pytest.raises(GraphsplitError, match="context and expert parallelism together are not supported yet"):
        Plan(dp=2, cp=2, ep=2)
    with pytest.raises(GraphsplitError, match="check --cp with graphsplit run --check"):
        check_locally(llama, Plan(dp=2, cp=2))


def test_summary_shows_each_ranks_chunks_and_the_exchange():
    """transform's summary under --cp: which positions each cp rank holds (chunks r and 2cp-1-r) and
    the keys and values each attention call gathers per rank (the GPT example's 8 samples, 4 heads of
    16, 16 of its 32 tokens a rank, fp32: 8 x 4 x 16 x 16 x 4 bytes each of k and v from the other rank)."""
    import io

    from rich.console import Console

    from graphsplit.loader import load_model
    from graphsplit.report.summary import render, summarize
    from graphsplit.rewrite import rewrite_loaded

    from .conftest import EXAMPLES

    program = rewrite_loaded(load_model(str(EXAMPLES / "gpt.py")), Plan(dp=2, cp=2)).program
    found = summarize(program)["context_parallel"]
    assert [r["positions"] for r in found["ranks"]] == [[[0, 7], [24, 31]], [[8, 15], [16, 23]]]
    assert [c["gathered_bytes"] for c in found["attention"]] == [2 * 8 * 4 * 16 * 16 * 4] * 4
    out = io.StringIO()
    render(summarize(program), Console(file=out, width=300))
    assert "rank 0: 0-7 and 24-31; rank 1: 8-15 and 16-23" in out.getvalue()
    assert "4 attention calls (4 causal) gather keys and values: 64.0 KiB" in out.getvalue()
