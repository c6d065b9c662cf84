"""Context parallelism's attention exchange (ops/cp.py) on real processes: each rank's queries over the
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

from graphsplit.ops.cp import (
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


def _rewritten(path):
    """The model's traced graph with context parallelism's rewrite, after the check that only
    attention mixes its sequence; and the loaded model file."""
    from graphsplit.analysis.batch import discover
    from graphsplit.compile import trace_loaded
    from graphsplit.loader import load_model
    from graphsplit.passes.context_parallel import check_sequence_mixers, context_parallel_rewrite
    from graphsplit.runtime.materialize import model_tensors

    loaded = load_model(str(path))
    traced = trace_loaded(loaded)
    flat = traced.flatten_inputs(loaded.args, loaded.kwargs)
    found = discover(traced.gm, traced.input_names, flat, lambda raw: list(raw) if isinstance(raw, tuple | list) else [raw],
                     lambda raw, target: loaded.loss_fn(traced.unflatten_output(raw), target), loaded.target)
    (by, _fixed) = found.mixers[traced.input_names[0]][1]
    check_sequence_mixers(traced.gm, by)
    gm = context_parallel_rewrite(traced.gm, CP)
    model = loaded.build("cpu", seed=0)  # the traced graph holds meta tensors: run it on the model's own
    tensors = model_tensors(model)
    return loaded, lambda *inputs: traced.unflatten_output(torch.func.functional_call(gm, tensors, inputs)), gm, model


def _model_worker(rank: int, port: int, path: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=CP, timeout=timedelta(seconds=60))
    try:
        loaded, run, gm, model = _rewritten(path)
        gm.get_submodule("cp_comm").bind(dist.group.WORLD)
        (idx,) = loaded.args
        logits = run(shard_sequence(idx, 1, rank, CP))
        loss = loaded.loss_fn(logits, shard_sequence(loaded.target, 1, rank, CP))
        loss.backward()
        grads = {}
        for name, p in model.named_parameters():  # data-parallel ranks: their mean, as DDP takes it
            dist.all_reduce(p.grad)
            grads[name] = p.grad / CP
        out[rank] = (logits.detach(), grads)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_the_llama_example_with_its_sequence_cut_in_two_equals_the_whole_model():
    """Context parallelism's rewrite of the Llama example (SDPA, RoPE tables sliced to the sequence)
    run on two processes, each its load-balanced half of every sequence: the logits put back in order
    equal the whole model's, and the ranks' mean gradient (equal token counts: the mean of their token
    means is the whole loss) equals the whole model's gradient."""
    from .conftest import EXAMPLES

    path = EXAMPLES / "llama.py"
    out = mp.Manager().dict()
    mp.spawn(_model_worker, args=(_free_port(), str(path), out), nprocs=CP, join=True)
    from graphsplit.loader import load_model

    loaded = load_model(str(path))  # the untouched model on the whole batch
    model = loaded.build("cpu", seed=0)
    logits = model(*loaded.args)
    loaded.loss_fn(logits, loaded.target).backward()
    torch.testing.assert_close(unshard_sequence([out[r][0] for r in range(CP)], 1), logits.detach(), rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(out[0][1][name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_sequence_mixed_outside_attention_is_refused_naming_the_module():
    """The GPT example's hand-written attention (matmuls and softmax over the sequence) is not an SDPA
    call context parallelism can gather at: refused in one line, not cut silently."""
    from graphsplit.errors import GraphsplitError

    from .conftest import EXAMPLES

    with pytest.raises(GraphsplitError, match=r"--cp: the sequence is mixed outside attention \(_?softmax along it in module h\.0\.attn at gpt\.py:43"):
        _rewritten(EXAMPLES / "gpt.py")
