"""Heads merged with the batch, and q/k/v packed in one projection (nn.MultiheadAttention, fairseq):
sharded by heads, each rank holds its heads of every example, so the merged (batch x heads) dim is
sharded chunk by chunk (DTensor's strided shard). The program equals the untouched model on the whole
batch, attention is not gathered, and a merged value an op needs whole is gathered in order."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.analysis.collectives import COLLECTIVES_OF, collectives
from graphsplit.backends import threads
from graphsplit.ir.sharding import Replicate, Shard, shard_tensor
from graphsplit.ir.trace_export import trace_export
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.ops import tp as tpops
from graphsplit.ops.tp_comm import TPComm

from .conftest import MODELS

PLANS = [Plan(tp=2), Plan(tp=2, pp=2), Plan(tp=4)]


def _forward_all_reduces(program, block: str) -> int:
    graphs = [st.gm.graph for st in program.stages]
    return sum(1 for b, direction, kind in collectives(graphs) if b == block and direction == "forward"
               and kind == "all_reduce")


@pytest.mark.parametrize("plan", PLANS, ids=["tp2", "tp2-pp2", "tp4"])
def test_packed_qkv_of_multihead_attention_is_sharded_by_heads(plan):
    """torch.export's nn.MultiheadAttention: `unflatten(-1, (3, E))` of the packed projection is read as
    q, k, v (each picked apart by select), not as 3 heads; its 4 heads split over tp 2 and 4."""
    loaded = load_model(str(MODELS / "packed_attention.py"))
    traced = trace_export(loaded.build("meta"), loaded.args, loaded.kwargs)
    program, cmp = check_locally(loaded, plan, traced=traced)
    assert cmp.ok, cmp.failures
    e = 32
    assert program.param_sharding("blocks.0.attn.in_proj_weight") == Shard(0, (e, e, e))  # q, k, v each split
    assert program.param_sharding("blocks.0.attn.out_proj.weight") == Shard(1)
    # attention and the MLP each one all-reduce forward: attention is sharded, nothing gathered
    assert _forward_all_reduces(program, "blocks.0") == 2
    assert not any(n.target is tpops.gather_chunks_from_tp for st in program.stages for n in st.gm.graph.nodes)


@pytest.mark.parametrize("plan", PLANS, ids=["tp2", "tp2-pp2", "tp4"])
def test_attention_over_a_merged_batch_and_heads_dim_stays_sharded(plan):
    """fairseq's `view(T, B * heads, head_dim)` then `bmm`: the bmm runs on each rank's heads."""
    loaded = load_model(str(MODELS / "merged_heads_attention.py"))
    program, cmp = check_locally(loaded, plan)
    assert cmp.ok, cmp.failures
    assert _forward_all_reduces(program, "layers.0") == 1  # the row-parallel out_proj's sum, nothing else
    assert not any(n.target is tpops.gather_chunks_from_tp for st in program.stages for n in st.gm.graph.nodes)


@pytest.mark.parametrize("plan", [Plan(tp=2), Plan(tp=2, pp=2, autocast="bf16")], ids=["tp2", "tp2-pp2-bf16"])
def test_bloom_is_sharded_by_heads_its_alibi_bias_cut_chunk_by_chunk(plan):
    """HF's BloomForCausalLM as is: q @ k^T over the merged batch x heads dim is `alibi.baddbmm(q, k)`, the
    bias (batch x heads, 1, keys) made from the heads' slopes whole on every rank, so each rank takes its
    heads of every sample of it (`scatter_chunks_to_tp`, no communication forward); its MLP's GeLU is a
    custom autograd Function that computes elementwise, which keeps the shard. Megatron's 2 + 2 all-reduces
    a block, nothing left whole, and the program equals the untouched model (bf16: baddbmm's bias cast
    with q and k, as torch.autocast casts them)."""
    loaded = load_model(str(MODELS / "hf_bloom.py"))
    program, cmp = check_locally(loaded, plan)
    assert cmp.ok, cmp.failures
    assert program.replicated == [], program.replicated
    nodes = [n for st in program.stages for n in st.gm.graph.nodes]
    # one cut of the bias, which every block reads (at most one per stage: a later stage may be sent it)
    assert 1 <= sum(n.target is tpops.scatter_chunks_to_tp for n in nodes) <= len(program.stages)
    assert not any(n.target is tpops.gather_chunks_from_tp for n in nodes)
    assert _forward_all_reduces(program, "transformer.h.0") == 2


def test_a_merged_value_an_op_needs_whole_is_gathered_in_order(tmp_path):
    """An op no rule knows (cumsum) over the merged scores: gathered chunk by chunk into the whole
    value, and the program still equals the untouched model (a gather in rank order would not)."""
    source = (MODELS / "merged_heads_attention.py").read_text()
    path = tmp_path / "merged_cumsum.py"
    path.write_text(source.replace("F.softmax(attn_weights, dim=-1)", "F.softmax(torch.cumsum(attn_weights, -1) * 0.1, dim=-1)"))
    loaded = load_model(str(path))
    program, cmp = check_locally(loaded, Plan(tp=2))
    assert cmp.ok, cmp.failures
    assert sum(n.target is tpops.gather_chunks_from_tp for st in program.stages for n in st.gm.graph.nodes) == 2


def test_gather_chunks_puts_every_rank_block_back_chunk_by_chunk():
    """Two chunks of 4 rows over tp 2 (rank r holds rows 2r..2r+1 of each chunk): the gather is the
    whole tensor; its backward gives each rank its block of every chunk of the gradient."""
    whole = torch.randn(3, 8, 5, dtype=torch.float64)
    layout = Shard(1, (4, 4))
    weight = torch.randn(3, 8, 5, dtype=torch.float64)
    hub = threads.ThreadHub(2)

    def work(rank):
        comm = TPComm(2)
        comm.bind(threads.ThreadLink(hub, rank))
        block = shard_tensor(whole, layout, rank, 2).clone().requires_grad_(True)
        gathered = tpops.gather_chunks_from_tp(block, 1, (4, 4), comm)
        (gathered * weight).sum().backward()
        return gathered.detach(), block.grad

    for rank, (gathered, grad) in enumerate(threads.run_ranks(hub, work)):
        assert torch.equal(gathered, whole)
        assert torch.equal(grad, shard_tensor(weight, layout, rank, 2))
    assert COLLECTIVES_OF[tpops.gather_chunks_from_tp] == [("forward", "all_gather")]  # counted and priced


@pytest.mark.parametrize("chunks", [(4, 4), (4, 2, 2)], ids=["equal", "unequal"])
def test_scatter_chunks_gives_each_rank_its_block_of_every_chunk(chunks):
    """The inverse of the gather above, for a whole value an op reads beside a chunked one (ALiBi's bias
    over a merged batch x heads dim): rank r gets its block of every chunk; the backward gathers the
    gradient's blocks back into the whole gradient, each rank's part where it came from."""
    whole = torch.randn(3, sum(chunks), 5, dtype=torch.float64, requires_grad=True)
    layout = Shard(1, chunks)
    weight = torch.randn(3, sum(chunks), 5, dtype=torch.float64)
    hub = threads.ThreadHub(2)

    def work(rank):
        comm = TPComm(2)
        comm.bind(threads.ThreadLink(hub, rank))
        x = whole.detach().clone().requires_grad_(True)
        block = tpops.scatter_chunks_to_tp(x, 1, chunks, comm)
        (block * shard_tensor(weight, layout, rank, 2)).sum().backward()
        return block.detach(), x.grad

    for rank, (block, grad) in enumerate(threads.run_ranks(hub, work)):
        assert torch.equal(block, shard_tensor(whole.detach(), layout, rank, 2))
        assert torch.equal(grad, weight)  # every rank's block of the gradient, gathered in place
    assert COLLECTIVES_OF[tpops.scatter_chunks_to_tp] == [("backward", "all_gather")]


@pytest.mark.parametrize("all_heads", [False, True])
def test_q_and_k_projections_before_a_per_head_norm_are_sharded_by_heads(all_heads, tmp_path):
    """Qwen3's and Gemma-3's qk-norm normalizes each head's vector: the lookahead follows the heads'
    shard through the view, the norm's mean over head_dim and the transpose, so q_proj and k_proj are
    column-parallel; OLMo-2's norm over the whole projection reads every head, and they stay whole."""
    source = (MODELS / "qk_norm.py").read_text()
    path = tmp_path / "qk_norm_model.py"
    path.write_text(source.replace("ALL_HEADS = False", f"ALL_HEADS = {all_heads}"))
    loaded = load_model(str(path))
    program, cmp = check_locally(loaded, Plan(tp=2))
    assert cmp.ok, cmp.failures
    for name in ("attn.q_proj.weight", "attn.k_proj.weight"):
        assert program.param_sharding(name) == (Replicate() if all_heads else Shard(0)), name
    assert program.param_sharding("attn.v_proj.weight") == Shard(0)
