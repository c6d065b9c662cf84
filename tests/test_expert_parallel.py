"""Expert parallelism (--ep): HF's mixtures of experts, unmodified, with whole experts per rank.

The token exchange itself (ops/ep.py) is checked on two gloo processes against the same experts
run whole in one process, with routings that leave a rank nothing to send and an expert nothing to
do. The pass is checked on the traced HF models (what it inserts, what it refuses). Parity on real
processes (the only place the exchange runs; the local backend refuses ep) covers each family once
at each composition the issue names: Mixtral at ep 2, Qwen3-MoE at ep 2 x pp 2 with FSDP for the
non-expert weights, DeepSeek-V3 (a dense
first layer, a shared expert, MLA) at ep 2 x tp 2; each against the untouched model on the whole batch.
"""

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.ops.ep import EPComm, ep_combine, ep_dispatch

from .conftest import EXAMPLES, MODELS, exported_weights, traced_once, untouched_after_sgd_step

EXPERTS, HIDDEN, OUT = 4, 3, 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _routing(rank: int) -> torch.Tensor:
    """Each rank's expert per row, sorted: rank 0 sends nothing to rank 1's experts (2, 3); expert 1
    gets no row from anyone; rank 1 sends rows to experts 0, 2 and 3."""
    return torch.tensor([0, 0, 0] if rank == 0 else [0, 2, 2, 3, 3, 3])


def _experts_whole(x: torch.Tensor, experts: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.stack([x[i] @ w[e] for i, e in enumerate(experts.tolist())])


def _exchange_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        w = torch.randn(EXPERTS, HIDDEN, OUT, generator=torch.Generator().manual_seed(0))
        experts = _routing(rank)
        x = torch.randn(len(experts), HIDDEN, generator=torch.Generator().manual_seed(1 + rank), requires_grad=True)
        offsets = torch.cumsum(torch.bincount(experts, minlength=EXPERTS), 0).to(torch.int32)
        comm = EPComm(2)
        comm.bind(dist.group.WORLD)
        mine = w.chunk(2)[rank].clone().requires_grad_(True)  # experts 2r, 2r + 1
        routed = ep_dispatch(x, offsets, comm, 0)
        rows, local_offsets = routed[0], routed[1]
        local_experts = torch.repeat_interleave(torch.arange(2), torch.diff(local_offsets.long(), prepend=torch.zeros(1, dtype=torch.long)))
        y = ep_combine(torch.stack([rows[i] @ mine[e] for i, e in enumerate(local_experts.tolist())]), routed, offsets, comm)
        (y * torch.arange(1.0, OUT + 1)).sum().backward()
        whole = w.clone().requires_grad_(True)
        x_ref = x.detach().clone().requires_grad_(True)
        want = _experts_whole(x_ref, experts, whole)
        (want * torch.arange(1.0, OUT + 1)).sum().backward()
        out[rank] = dict(y=y.detach(), want=want.detach(), grad_x=x.grad, want_x=x_ref.grad, grad_w=mine.grad,
                         part_w=whole.grad, received=comm.take_tokens()[0])
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_token_exchange_matches_whole_experts_on_two_processes():
    """Outputs come back to the rows they left (rank 0's rows all to its own experts, rank 1's split
    over both ranks), input gradients come back through the reverse all-to-all, and each rank's expert
    slice gets the sum of both ranks' contributions; a rank that receives no rows for an expert still
    takes part."""
    out = mp.Manager().dict()
    mp.spawn(_exchange_worker, args=(_free_port(), out), nprocs=2, join=True)
    for rank in (0, 1):
        r = out[rank]
        torch.testing.assert_close(r["y"], r["want"])
        torch.testing.assert_close(r["grad_x"], r["want_x"])
    # expert weight gradients: rank r's slice = the sum over both ranks' rows of experts 2r, 2r + 1
    full = out[0]["part_w"] + out[1]["part_w"]
    torch.testing.assert_close(out[0]["grad_w"], full[:2])
    torch.testing.assert_close(out[1]["grad_w"], full[2:])
    # load balance: rows each local expert received (rank 0: expert 0 from 3 + 1 rows, expert 1 none)
    assert out[0]["received"].tolist() == [4, 0]
    assert out[1]["received"].tolist() == [2, 3]


def test_unbound_exchange_keeps_every_expert_local():
    """The meta analysis runs the graph unbound: nothing moves, every expert is local (a balanced
    routing's shapes)."""
    x = torch.randn(6, HIDDEN)
    offsets = torch.tensor([3, 3, 5, 6], dtype=torch.int32)
    rows, local, received = ep_dispatch(x, offsets, EPComm(2))
    assert rows is x and local is offsets and received.tolist() == [[3, 0, 2, 1]]
    assert ep_combine(rows, (rows, local, received), offsets, EPComm(2)) is rows


def _compile(name, plan):
    from graphsplit.rewrite import rewrite_loaded

    loaded, traced = traced_once(MODELS / name)
    return rewrite_loaded(loaded, plan, traced=traced).program


def test_pass_places_every_moe_layer_and_never_cuts_inside_one():
    program = _compile("hf_mixtral.py", Plan(dp=2, ep=2, pp=2))
    layers = [(layer.module, layer.experts, layer.ranks_hold(2)) for layer in program.expert_layers]
    assert layers == [(f"model.layers.{i}.mlp.experts", 4, [(0, 1), (2, 3)]) for i in (0, 1)]
    assert sorted(program.expert_params) == sorted(f"model.layers.{i}.mlp.experts.{w}" for i in (0, 1)
                                                   for w in ("gate_up_proj", "down_proj"))
    assert "gate.weight" not in " ".join(program.expert_params), "the router stays whole on every rank"
    for stage in program.stages:
        code = stage.gm.code
        # each layer's exchange whole in one stage: as many dispatches as combines
        assert code.count("ep_dispatch(") == code.count("ep_combine(")
    assert sum(s.gm.code.count("ep_dispatch(") for s in program.stages) == 2


def test_per_row_values_the_experts_read_move_with_the_rows():
    """gpt-oss adds each expert's bias to its rows: the bias gathered per routed row (by the sorted expert
    ids, before the exchange) goes through the same all-to-all; the bias after the last grouped matmul is
    added after the combine, on the rows in their own order."""
    from graphsplit.ops.ep import ep_dispatch

    program = _compile("hf_gpt_oss.py", Plan(dp=2, ep=2))
    dispatches = [n for st in program.stages for n in st.gm.graph.nodes if n.target is ep_dispatch]
    assert len(dispatches) == 2 and all(len(n.args) == 5 for n in dispatches), [n.args for n in dispatches]
    assert "model.layers.0.mlp.experts.gate_up_proj_bias" not in program.expert_params  # whole on every rank


def test_ep_with_tp_shards_each_rank_s_experts_over_tp():
    """ep 2 x tp 2: each ep rank's experts are column/row-parallel over tp (expert tensor parallelism)."""
    program = _compile("hf_deepseek_v3.py", Plan(dp=2, ep=2, tp=2))
    name = "model.layers.1.mlp.experts.down_proj"
    assert name in program.expert_params
    assert str(program.param_sharding(name)) == "S(2)"


def test_refusals_are_one_line_each(tmp_path):
    from graphsplit.launch.parity import check_locally
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded

    with pytest.raises(GraphsplitError, match="ep must divide dp"):
        Plan(dp=3, ep=2)
    with pytest.raises(GraphsplitError, match="no mixture-of-experts layer"):
        rewrite_loaded(load_model(str(EXAMPLES / "gpt.py")), Plan(dp=2, ep=2))
    loaded, traced = traced_once(MODELS / "hf_qwen3_moe.py")
    with pytest.raises(GraphsplitError, match="run --check"):
        check_locally(loaded, Plan(dp=2, ep=2), traced=traced)
    six = tmp_path / "six_experts.py"
    six.write_text((MODELS / "hf_mixtral.py").read_text().replace("num_local_experts=4", "num_local_experts=6")
                   .replace("Path(__file__).resolve().parent", f"Path({str(MODELS)!r})"))
    with pytest.raises(GraphsplitError, match=r"has 6 experts, which 4 ranks cannot hold equally; use an --ep that divides 6"):
        rewrite_loaded(load_model(str(six)), Plan(dp=4, ep=4))


REAL = [
    ("hf_mixtral.py", Plan(dp=2, ep=2)),
    ("hf_qwen3_moe.py", Plan(dp=2, ep=2, pp=2, fsdp=True)),  # FSDP2 for the rest, the experts left to ep
    ("hf_deepseek_v3.py", Plan(dp=2, ep=2, tp=2)),
    # per-expert biases gathered per routed row: moved with the rows
    ("hf_gpt_oss.py", Plan(dp=2, ep=2)),
]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, plan", REAL, ids=[f"{n.removesuffix('.py')}-ep{p.ep}-pp{p.pp}-tp{p.tp}{'-fsdp' * p.fsdp}" for n, p in REAL])
def test_ep_on_real_processes_matches_untouched_model(name, plan, tmp_path, capfd):
    import json

    from graphsplit.launch.launcher import RunOptions, run_training

    lines: list[str] = []
    metrics = tmp_path / "metrics.jsonl"
    cmp = run_training(str(MODELS / name), plan, RunOptions(steps=2, check=True, timeout_s=240, metrics=str(metrics)),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    experts = [k for k in cmp.max_diff if ".experts.down_proj" in k and k.startswith("grad")]
    dp_ranks = {int(k.rsplit("(rank ", 1)[1].rstrip(")")) // (plan.pp * plan.tp) for k in experts}
    assert dp_ranks == {0, 1}, "both ep ranks' expert slices compared"
    assert lines[-1].startswith("check passed")
    # load balance: every routed row counted once, at its expert (4 x 8 tokens, top-2)
    for row in map(json.loads, metrics.read_text().splitlines()):
        counts = row["tokens_per_expert"]
        assert counts and all(len(c) == 4 and sum(c) == 4 * 8 * 2 for c in counts.values()), counts
    assert "expert load max/mean" in capfd.readouterr().out  # the progress line (the ranks' stdout)


def test_summary_shows_which_ranks_hold_which_experts():
    import io

    from rich.console import Console

    from graphsplit.report.summary import render, summarize

    summary = summarize(_compile("hf_qwen3_moe.py", Plan(dp=2, ep=2, pp=2)))
    layer = summary["experts"][0]
    assert layer["ranks"] == [{"ep_rank": 0, "first": 0, "last": 1}, {"ep_rank": 1, "first": 2, "last": 3}]
    # a micro-batch is 1 of the replica's 2 sequences: 8 tokens, top-2, hidden 32 in fp32; half of the
    # 16 rows leave the rank
    assert layer["all_to_all_bytes"] == {"dispatch": 8 * 32 * 4, "combine": 8 * 32 * 4}
    out = io.StringIO()
    render(summary, Console(file=out, width=200))
    assert "4 experts (rank 0: 0-1, rank 1: 2-3)" in out.getvalue()


def test_grouped_linears_count_their_flops():
    """torch's FLOP counter has no formula for HF's grouped matmul: each routed row's product with its
    expert's weight is counted (the cost the pipeline split balances and the planner prices)."""
    from graphsplit.ir.meta import info
    from graphsplit.ir.op_kinds import OpKind

    gm = _compile("hf_mixtral.py", Plan()).stages[0].gm
    grouped = [info(n) for n in gm.graph.nodes if info(n).kind == OpKind.GROUPED_LINEAR]
    rows = 4 * 8 * 2  # one micro-batch: 4 sequences of 8 tokens, top-2
    assert [g.flops for g in grouped] == [2 * rows * 32 * 128, 2 * rows * 64 * 32] * 2


def test_planner_prices_expert_parallelism():
    """The planner proposes ep (drawn from dp, dividing the experts) for a mixture of experts: one ep
    rank holds 1/ep of the expert weights (and their gradients and AdamW state), and pays the
    all-to-alls of its routed rows."""
    from collections import Counter

    from graphsplit.loader import load_model
    from graphsplit.planner import load_hardware
    from graphsplit.planner.estimate import estimate
    from graphsplit.planner.profile import profile_model
    from graphsplit.planner.search import candidates
    from graphsplit.planner.stages import plan_stages

    loaded = load_model(str(MODELS / "hf_mixtral.py"))
    profile = profile_model(loaded)
    hw = profile.hardware = load_hardware("h100")
    assert profile.experts == 4

    def predict(plan):
        return estimate(plan, plan_stages(profile, plan), hw, profile.batch, profile.tokens_per_sample,
                        profile.model_flops_per_sample)

    whole, placed = predict(Plan(dp=2)), predict(Plan(dp=2, ep=2))
    experts = sum(p.numel() * 4 for n, p in loaded.build("meta").named_parameters() if ".experts." in n)
    assert whole.memory["parameters"] - placed.memory["parameters"] == experts // 2
    assert whole.memory["optimizer_state"] - placed.memory["optimizer_state"] == experts  # AdamW's two moments
    assert whole.time["all_to_all"] == 0 < placed.time["all_to_all"]
    found = list(candidates(4, 8, 4, 8, True, Counter(), experts=4))
    assert {(p.ep, p.fsdp) for p in found if p.dp == 4} == {(e, f) for e in (1, 2, 4) for f in (False, True)}
    assert {p.ep for p in candidates(64, 8, 64, 8, True, Counter(), experts=256) if p.dp == 64} == {1, 16, 32, 64}
    assert {p.ep for p in candidates(4, 8, 4, 8, True, Counter())} == {1}, "no MoE layer: no ep"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_checkpoint_at_ep2_exports_the_whole_experts_and_resumes_without_ep(tmp_path):
    """Each ep rank hands DCP its experts' slice at its offsets: the checkpoint exports to the model's own
    names and shapes, equal to the untouched model after the same step, and resumes at pp 2 (every
    rank holding all experts) with --check against the untouched model holding those weights."""
    from graphsplit.launch.launcher import RunOptions, run_training

    spec = str(MODELS / "hf_mixtral.py")
    common = dict(optimizer="sgd", lr=0.01, timeout_s=300)
    run_training(spec, Plan(dp=2, ep=2), RunOptions(steps=1, save=str(tmp_path / "a"), **common), echo=print)
    saved = exported_weights(tmp_path / "a")
    _, reference, _ = untouched_after_sgd_step(spec, 0.01)  # on the whole batch
    experts = [n for n in saved if ".experts." in n]
    assert experts and all(saved[n].shape[0] == 4 for n in experts), "every expert, from both ep ranks"
    for name, p in reference.named_parameters():
        torch.testing.assert_close(saved[name], p.detach(), rtol=1e-5, atol=1e-5, msg=name)
    lines: list[str] = []
    cmp = run_training(spec, Plan(pp=2), RunOptions(steps=1, resume=str(tmp_path / "a"), check=True, **common),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)


def test_a_fold_after_unlike_first_blocks_equals_the_whole_graph(tmp_path, monkeypatch):
    """DeepSeek-V3's first layers are dense, the rest mixtures of experts: the planner folds the MoE run
    (the dense layers, and the first MoE layer, which makes values the later ones share, join the head)
    and unfolding it gives every number compiling all layers gives."""
    import numpy as np

    from graphsplit.ir import repeats as repeats_module
    from graphsplit.loader import load_model
    from graphsplit.planner.profile import profile_model

    deep = tmp_path / "deep_deepseek.py"
    deep.write_text((MODELS / "hf_deepseek_v3.py").read_text()
                    .replace("num_hidden_layers=2", "num_hidden_layers=9")
                    .replace("first_k_dense_replace=1", "first_k_dense_replace=2")
                    .replace("Path(__file__).resolve().parent", f"Path({str(MODELS)!r})"))
    loaded = load_model(str(deep))
    folded = profile_model(loaded)
    assert folded.folded
    monkeypatch.setattr(repeats_module, "MIN_BLOCKS", 10**6)  # no run of repeated blocks anywhere
    whole = profile_model(loaded)
    assert not whole.folded
    for key in ((1, False, False), (1, True, False)):
        a, b = folded.variants[key], whole.variants[key]
        for field in ("flops", "bytes", "out", "live"):
            assert all(np.array_equal(x, y) for x, y in zip(getattr(a, field), getattr(b, field))), (key, field)
        assert a.params == b.params and a.param_bytes == b.param_bytes and a.collectives == b.collectives
        assert np.array_equal(a.grouped, b.grouped) and np.array_equal(a.expert_bytes, b.expert_bytes)
        assert a.expert_params() == b.expert_params() and len(a.expert_params()) == 2 * 7  # 7 MoE layers


@pytest.mark.parametrize("kind", ["normal", "uniform", "given"])
def test_fast_init_draws_each_ep_rank_s_experts_as_the_whole_weight_holds_them(kind):
    """Each element keeps its value whatever the plan: an ep rank's slice of an expert weight, drawn tile by
    tile (tiles cut across the expert dim and over 256 rows), equals that slice of the whole weight drawn
    at ep 1; so does a tp shard of it."""
    import torch.nn as nn

    from graphsplit.ir.sharding import Shard
    from graphsplit.runtime.fast_init import FastInit, Rule

    owner = nn.Module()
    owner.w = nn.Parameter(torch.empty(6, 300, 5, device="meta"))
    given = {"w": torch.randn(6, 300, 5)} if kind == "given" else None
    rule = Rule(kind, 0.0 if kind == "normal" else 0.5, 0.02 if kind == "normal" else 0.0)
    source = FastInit({"w": rule}, owner, {}, seed=3, given=given)
    whole = torch.empty(6, 300, 5)
    source.fill(whole, "w", None, 0, 1)
    for ep in (2, 3):
        for r in range(ep):
            mine = torch.empty(6 // ep, 300, 5)
            source.fill(mine, "w", None, 0, 1, (0, r, ep))
            torch.testing.assert_close(mine, whole.chunk(ep)[r], rtol=0, atol=0)
    shard = torch.empty(3, 150, 5)  # ep 2 rank 1, tp 2 rank 0 over dim 1
    source.fill(shard, "w", Shard(1), 0, 2, (0, 1, 2))
    torch.testing.assert_close(shard, whole[3:, :150], rtol=0, atol=0)
