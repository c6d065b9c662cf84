"""The planner: memory it predicts against bytes measured, its search, its plan file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from graphsplit import Plan
from graphsplit.analysis.memory import gathered_dtype, saved_bytes
from graphsplit.errors import GraphsplitError
from graphsplit.ir import repeats as repeats_module
from graphsplit.ir.trace import trace_model
from graphsplit.loader import load_model
from graphsplit.planner import alike_blocks as alike_module
from graphsplit.planner import fold as fold_module
from graphsplit.planner import load_hardware, plan_model
from graphsplit.planner import profile as profile_module
from graphsplit.planner import recompute as recompute_module
from graphsplit.planner import stages as stages_module
from graphsplit.planner import tile as tile_module
from graphsplit.planner.estimate import estimate
from graphsplit.planner.param_reads import unit_bytes
from graphsplit.planner.profile import profile_model, start_profile
from graphsplit.planner.schedules import (
    awaiting_weights,
    bubble_fraction,
    held_activations,
    in_flight_chunks,
    rank_actions,
)
from graphsplit.planner.search import search
from graphsplit.planner.stages import plan_stages, region_spans
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES, MODELS, ROOT
from .test_cli import cli

CPU = load_hardware("cpu")


def _profiled(name: str):
    loaded = load_model(str(EXAMPLES / f"{name}.py"))
    profile = profile_model(loaded, (1, 2))
    profile.hardware = CPU
    return loaded, profile


@pytest.fixture(scope="module")
def gpt():
    return _profiled("gpt")


@pytest.fixture(scope="module")
def llama():
    return _profiled("llama")


def predict(profile, plan: Plan):
    return estimate(plan, plan_stages(profile, plan), CPU, profile.batch, profile.tokens_per_sample,
                    profile.model_flops_per_sample)


# plans whose per-rank parameter, gradient and AdamW bytes are measured on real processes below: one
# launch of 4 processes covers dp (DDP and FSDP), pp (1F1B and interleaved), tp and their pairs
WORLD_4 = [Plan(pp=4), Plan(dp=2, pp=2), Plan(pp=2, tp=2), Plan(dp=2, tp=2, fsdp=True),
           Plan(dp=2, pp=2, fsdp=True, checkpoint="blocks"), Plan(pp=2, tp=2, autocast="bf16"), Plan(tp=4),
           Plan(dp=2, pp=2, schedule="interleaved-1f1b", stages_per_rank=2, microbatches=4), Plan(dp=4),
           Plan(dp=4, fsdp=True), Plan(dp=4, autocast="bf16"), Plan(dp=4, fsdp=True, autocast="bf16"),
           Plan(dp=2, tp=2, fsdp=True, autocast="bf16", sequence_parallel=True),
           Plan(dp=2, pp=2, fsdp=True, autocast="bf16", microbatches=2), Plan(dp=4, fsdp=True, checkpoint="blocks")]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_predicted_parameter_gradient_and_adamw_bytes_equal_measured_ones(gpt, tmp_path):
    """14 plans, one torchrun launch: every pp rank's parameters, gradients and AdamW state, as
    measured after one step on real gloo processes, are what the planner predicts, byte for byte; and
    on one stage (pp 1, one micro-batch) the activations the step keeps for backward, counted as
    autograd saves them, within 10% of the planner's activations and loss buffers (two of the outputs'
    size: torch's cross-entropy keeps one, the vocab-parallel one two).
    FSDP under bf16 keeps no cast copy of a weight (the gathered bf16 weight is the parameter): less
    than the same plan without FSDP, measured and predicted alike. Across micro-batches FSDP under bf16
    accumulates each stage's gradients unsharded in fp32 (its reduce dtype): the bytes it holds at their
    peak are the rank's stages' whole fp32 parameters, as the planner prices them; under a pipeline those,
    not the shards made from them after the stage's last backward, are the gradients the peak holds. Under a pipeline
    schedule (1F1B, interleaved, with tp) the activations alive at the rank's peak equal the planner's
    (within 1%; the last stage's loss buffers within 15%). DDP's buckets, as DDP reports their sizes,
    hold a second copy of the gradients of every plain-dp plan, and the planner's buffers hold them."""
    loaded, profile = gpt
    checked = 0
    for world, plans in ((4, WORLD_4),):
        out = tmp_path / f"world{world}"
        out.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               str(ROOT / "tests" / "workers" / "measure_memory.py"), str(EXAMPLES / "gpt.py"), str(out),
               *(p.to_json() for p in plans)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stderr[-3000:]
        ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(world)]
        for index, plan in enumerate(plans):
            predicted = predict(profile, plan).per_rank
            for rank in ranks:
                measured = rank[index]
                for part in ("parameters", "gradients", "optimizer_state"):
                    want = predicted[part][measured["pp_rank"]]
                    if plan.fsdp and plan.pp > 1 and part == "gradients":
                        # under a pipeline the peak holds the unsharded gradients the stage accumulates;
                        # the shards measured after the step are made from them once its backwards end
                        assert measured[part] < want, (plan, measured, want)
                        if plan.autocast:
                            assert measured["accumulated_gradients"] == want, (plan, measured, want)
                    elif plan.fsdp and measured["dp_rank"] > 0:
                        assert measured[part] <= want, (plan, part)  # later dp shards are never larger
                    else:
                        assert measured[part] == want, (plan, part, measured, predicted)
                # DDP's buckets: a second copy of the gradients, priced among the communication buffers
                buckets = measured["ddp_buckets"]
                assert buckets == (predicted["gradients"][measured["pp_rank"]] if plan.ddp else 0), (plan, measured)
                assert buckets <= predicted["communication_buffers"][measured["pp_rank"]], (plan, measured)
                if plan.fsdp and plan.autocast and plan.num_microbatches > 1:
                    stages = plan_stages(profile, plan).param_bytes
                    mine = sum(int(stages[s]) for s in plan.stages_of_rank(measured["pp_rank"]))
                    assert measured["accumulated_gradients"] == mine, (plan, measured, mine)
                if plan.pp == 1 and plan.checkpoint == "none":  # (a region's recompute saves through its own hooks)
                    want = predicted["activations"][0] + predicted["outputs_and_loss"][0]
                    assert abs(measured["activations"] - want) <= 0.10 * want, (plan, measured, want)
                elif not plan.fsdp and plan.checkpoint == "none":
                    # the schedule's peak: what each of the rank's stages keeps, times the micro-batches
                    # torch's order leaves in flight on it (`held_activations`); the last stage's loss
                    # buffers are priced at two outputs' size, the cross-entropy keeping less
                    r = measured["pp_rank"]
                    want = predicted["activations"][r] + predicted["outputs_and_loss"][r]
                    slack = 0.15 if r == plan.pp - 1 else 0.01
                    assert want * (1 - slack) <= measured["peak_activations"] <= want * 1.01, (plan, measured, want)
            checked += 1
    assert checked == len(WORLD_4)
    # FSDP with one stage: each block a unit of its own (checkpointed or run plainly), resharded after
    # its forward (the tied LM head's region stays in the stage's unit): a rank holds a fraction of the
    # stage gathered, where one unit per stage holds all of it
    for plan in (Plan(dp=4, fsdp=True), Plan(dp=4, fsdp=True, checkpoint="blocks")):
        index, table = WORLD_4.index(plan), profile.table(plan)
        units = int(np.count_nonzero(unit_bytes(table, plan, region_spans(table, "blocks", 0, table.n))))
        stage = int(plan_stages(profile, plan).param_bytes[0])
        buffers = predict(profile, plan).per_rank["communication_buffers"][0]
        assert units >= 3 and all(r[index]["fsdp_units"] == units + 1 for r in ranks), (plan, units)
        assert all(r[index]["gathered_peak"] <= buffers < 2 * stage for r in ranks), (plan, buffers, stage)
        assert all(r[index]["gathered_peak"] < 0.6 * stage for r in ranks), (plan, stage)
    plain, gathered = (WORLD_4.index(p) for p in (Plan(dp=4, autocast="bf16"), Plan(dp=4, fsdp=True, autocast="bf16")))
    assert ranks[0][gathered]["activations"] < 0.8 * ranks[0][plain]["activations"]
    assert predict(profile, WORLD_4[gathered]).memory["activations"] < 0.8 * predict(profile, WORLD_4[plain]).memory["activations"]


PLANS = [Plan(pp=2), Plan(pp=4), Plan(tp=2, pp=2), Plan(pp=2, autocast="bf16"), Plan(pp=2, checkpoint="blocks"),
         Plan(pp=4, microbatches=8), Plan(tp=2, pp=2, checkpoint="blocks"), Plan(pp=2, checkpoint="every:2"),
         Plan(tp=2), Plan(pp=2, checkpoint="stage"), Plan(pp=2, tp=2, autocast="bf16"), Plan(pp=2, checkpoint="selective"),
         Plan(tp=2, pp=2, checkpoint="selective"), Plan(pp=2, checkpoint="first:1"),
         Plan(pp=2, checkpoint="selective:2"), Plan(tp=2, pp=2, checkpoint="selective:2"),
         Plan(tp=2, pp=2, sequence_parallel=True),
         Plan(dp=2, tp=2, pp=2, fsdp=True, autocast="bf16", sequence_parallel=True)]


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_activations_within_ten_percent_of_the_measurement(name, gpt, llama):
    """Bytes kept for backward per stage against analysis/memory.py's measurement on each compiled stage."""
    loaded, profile = {"gpt": gpt, "llama": llama}[name]
    worst = 0.0
    for plan in PLANS:
        predicted = plan_stages(profile, plan).saved_bytes
        program = rewrite_loaded(loaded, plan).program
        for st, want in zip(program.stages, predicted):
            names = {id(st.gm.get_parameter(k)): c for k, c in st.param_sources.items()}
            got = saved_bytes(st.gm, st.input_examples(), plan.tp, True, program.param_shardings, names,
                              gathered_dtype(plan))
            worst = max(worst, abs(int(want) - got) / got)
        # the cut is the compiler's own: each stage holds the parameters a transform gives it
        assert list(plan_stages(profile, plan).param_bytes) == [program.stage_param_bytes(s.index) for s in program.stages]
    assert worst <= 0.10, worst


def test_folded_profile_equals_the_whole_graph(monkeypatch):
    """Compiling two blocks and unfolding them gives every number compiling all of them gives."""
    loaded = load_model(str(EXAMPLES / "llama.py"))
    folded = profile_model(loaded, (2,))
    assert folded.folded
    monkeypatch.setattr(repeats_module, "MIN_BLOCKS", 10**6)  # no run of repeated blocks anywhere
    whole = profile_model(loaded, (2,))
    assert not whole.folded
    for key in ((1, False, False), (2, False, False), (2, True, False)):
        a, b = folded.variants[key], whole.variants[key]
        for field in ("flops", "bytes", "out", "live"):
            assert all(np.array_equal(x, y) for x, y in zip(getattr(a, field), getattr(b, field))), (key, field)
        assert a.params == b.params and a.param_bytes == b.param_bytes and a.collectives == b.collectives
        assert np.array_equal(a.blocked, b.blocked) and a.blocks == b.blocks


@pytest.fixture(scope="module")
def deep():
    """The Llama example 10 blocks deep: copies 1..9 of the folded block, measured over 4 and tiled."""
    loaded = load_model(str(MODELS / "deep_llama.py"))
    return loaded, profile_model(loaded, (2,))


def _same_tables(a, b) -> None:
    """Every field of two tables equal; storage and value ids compared by what they stand for."""
    for name in ("flops", "bytes", "out", "live", "selective", "selective_attention"):
        assert all(np.array_equal(x, y) for x, y in zip(getattr(a, name), getattr(b, name))), name
    for name in ("blocked", "low_rate", "compute", "block", "matmul_calls", "gemm_k", "gemm_n"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for name in ("blocks", "block_inputs", "params", "param_bytes", "param_shapes", "collectives", "output", "period"):
        assert getattr(a, name) == getattr(b, name), name

    def kept(t):  # storages keyed by the node that made them: named by first appearance (traces name nodes apart)
        names: dict[str, int] = {}
        return [[((names.setdefault(t.storage_keys[i][0], len(names)), *t.storage_keys[i][1:]),
                  int(t.storage[0][i]), int(t.storage[1][i])) for i in row] for row in t.kept]

    def reads(t):
        ids: dict[int, int] = {}
        return [[(ids.setdefault(v, len(ids)), at, ps, c) for v, at, ps, c in row] for row in t.reads]

    assert kept(a) == kept(b)
    assert reads(a) == reads(b)


def test_a_tiled_profile_equals_measuring_every_copy(deep, monkeypatch):
    """Measuring 4 copies of the folded block and tiling the rest (tile.py) gives every number
    measuring all 9 gives, at tp 1 and 2, in fp32 and low precision."""
    loaded, tiled = deep
    monkeypatch.setattr(tile_module, "SHORT", 10**6)
    whole = profile_model(loaded, (2,))
    for key in ((1, False, False), (1, True, False), (2, False, False), (2, True, False)):
        assert tiled.variants[key].n == whole.variants[key].n > 0
        _same_tables(tiled.variants[key], whole.variants[key])


def test_blocks_alike_the_second_are_traced_as_one_call_and_give_the_same_tables(deep, monkeypatch):
    """Blocks 3..10 of the deep Llama are alike block 2 in everything tracing sees (alike_blocks.py): the
    planner traces them as one call each and stands block 2 in for them; every table equals the one
    from tracing every block."""
    loaded, alike_profile = deep
    blocks, alike = alike_module.alike_blocks(loaded.build("meta"))
    assert blocks[0] == "layers.0" and len(blocks) == 10 and alike == frozenset(blocks[2:])
    monkeypatch.setattr(profile_module, "alike_blocks", lambda model: (alike_module.alike_blocks(model)[0], frozenset()))
    whole = profile_model(loaded, (2,))
    for key in ((1, False, False), (1, True, False), (2, False, False), (2, True, False)):
        _same_tables(alike_profile.variants[key], whole.variants[key])


class _Block(torch.nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x, mask):
        return x + self.lin(x) * mask * self.scale


class _Stack(torch.nn.Module):
    def __init__(self, scales=(1.0,) * 6) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(s) for s in scales)
        self.register_buffer("masks", torch.ones(2, 8))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x, self.masks[i % 2])  # blocks 0, 2, 4 read one mask, 1, 3, 5 the other
        return x


def test_blocks_that_differ_or_run_hooks_are_not_alike():
    assert alike_module.alike_blocks(_Stack())[1] == frozenset({"blocks.2", "blocks.3", "blocks.4", "blocks.5"})
    assert alike_module.alike_blocks(_Stack((1.0, 1.0, 1.0, 2.0, 1.0, 1.0)))[1] == frozenset()
    hooked = _Stack()
    hooked.blocks[4].register_forward_hook(lambda *a: None)
    assert alike_module.alike_blocks(hooked)[1] == frozenset()


def test_alike_blocks_called_differently_are_traced_through(tmp_path):
    """Blocks alike in their attributes but given different values (here every other block another
    mask) are not the same ops: the trace with them as single calls does not fold, so the model is
    traced through, as a whole trace would see it."""
    model = _Stack()
    blocks, alike = alike_module.alike_blocks(model)
    args = (torch.randn(2, 8),)
    traced = trace_model(model, args, {}, leaves=alike, watch=frozenset(blocks[:2]))
    assert any(n.op == "call_module" and n.target == "blocks.5" for n in traced.gm.graph.nodes)
    assert fold_module.fold(traced.gm, traced.calls, alike) is None
    whole = trace_model(model, args, {})
    assert fold_module.fold(whole.gm) is None  # the whole trace sees the alternating masks too
    file = tmp_path / "stack.py"
    file.write_text("import torch\nfrom tests.test_planner import _Stack\n\n"
                    "def build_model():\n    return _Stack()\n\n"
                    "def example_inputs():\n    return (torch.randn(4, 8),)\n")
    profile = start_profile(load_model(str(file)))
    assert not any(n.op == "call_module" and n.target in alike for n in profile.source.base.graph.nodes)


def test_a_middle_stage_prices_as_the_same_ops_blocks_earlier(deep):
    """The search prices a stage deep in the repeated blocks as the same stage moved back (recompute.py
    `stage_shifts`): every policy, at two micro-batch sizes, gives what pricing it where it lies gives."""
    table = deep[1].variants[1, False, False]
    first, length, end = table.period
    hw = load_hardware("h100")
    rng = np.random.default_rng(0)
    moved = 0
    while moved < 40:
        a = int(rng.integers(first, end))
        e = int(rng.integers(a + 1, end + 1))
        shift = int(recompute_module.stage_shifts(table, np.array([a, e]))[0])
        if not shift:
            continue
        moved += 1
        for policy in ("none", "selective", "selective:2", "blocks", "every:2", "every:3", "stage"):
            for b in (1, 3):
                secs = stages_module._recompute_seconds(table, b, hw, False)
                comm = stages_module.tp_op_seconds(table, b, hw, "forward")
                here = recompute_module.policy_kept(table, policy, a, e, b, secs, comm)
                there = recompute_module.policy_kept(table, policy, a - shift, e - shift, b, secs, comm)
                assert here[:2] == there[:2] and here[2] == pytest.approx(there[2], rel=1e-12), (policy, a, e, b)


def test_checkpointed_regions_are_priced_with_their_forward_collectives_run_again(llama):
    """A checkpointed region runs its forward again in backward, tp collectives included (the program's
    summary lists them as "recompute"): the whole stage's under `stage`, every block's under `selective` (its kept
    matmul outputs spare the matmuls, not the gathers), some under `blocks`, none
    without checkpointing; they count in the recompute's seconds and in the step's tp time."""
    _, profile = llama
    found = {}
    for policy in ("none", "blocks", "stage", "selective"):
        plan = Plan(tp=2, pp=2, checkpoint=policy, sequence_parallel=True)
        table, st = profile.table(plan), plan_stages(profile, plan)
        b = profile.batch // plan.sample_replicas // plan.num_microbatches
        bounds = [0, *stages_module.cuts(table, 2, b), table.n]
        per_op = stages_module.tp_op_seconds(table, b, CPU, "forward")
        forward = np.array([per_op[a:e].sum() for a, e in zip(bounds[:-1], bounds[1:])])
        # what the recompute of a whole stage runs: up to its last op that keeps anything (torch's early stop)
        recomputed = np.array([per_op[a:table.recompute_stop(a, e)].sum() for a, e in zip(bounds[:-1], bounds[1:])])
        in_blocks = np.where(table.block >= 0, per_op, 0.0)  # the embedding's and LM head's are in no block
        blocks = np.array([in_blocks[a:e].sum() for a, e in zip(bounds[:-1], bounds[1:])])
        assert (forward > blocks).all() and blocks.all() and (recomputed <= forward).all() and recomputed[0] < forward[0]
        found[policy] = st.recompute_tp_seconds
        assert (st.recompute_seconds >= st.recompute_tp_seconds).all()
        est = predict(profile, plan)
        assert est.time["tp_collectives"] == pytest.approx(plan.num_microbatches * float((st.tp_seconds + st.recompute_tp_seconds)[0]))
        if policy == "stage":
            assert found[policy] == pytest.approx(recomputed)
        if policy == "selective":  # a part of a block the cut leaves without FLOPs is not checkpointed
            regions, _ = recompute_module._regions(table, bounds[-2], bounds[-1], 1)
            ran = sum(in_blocks[lo:table.recompute_stop(lo, hi)].sum() for lo, hi in regions)
            assert (found[policy] <= blocks + 1e-15).all() and found[policy][-1] == pytest.approx(ran) and ran > 0
    assert not found["none"].any()
    assert (0 < found["blocks"]).all() and (found["blocks"] <= found["stage"] + 1e-15).all()


def test_a_recompute_stops_where_torchs_checkpoint_stops(llama):
    """torch's non-reentrant checkpoint stops recomputing a region once every tensor it kept is back: a
    block's last projection (a matmul keeps only its input, packed before it runs) and its residual add do
    not run again. On an H200 the Llama stage's `blocks` recompute took 118 ms, priced 159 ms while every
    op ran again, 114 ms now (bench/gpu_stage.py). A split-backward schedule's region runs whole
    (`_RecomputeOnce`)."""
    _, profile = llama
    plan = Plan(checkpoint="blocks")
    table = profile.table(plan)
    b = profile.batch
    secs = stages_module._recompute_seconds(table, b, CPU, False)
    comm = stages_module.tp_op_seconds(table, b, CPU, "forward")
    regions, _ = recompute_module._regions(table, 0, table.n, 1)
    skipped = 0.0
    for lo, hi in regions:
        stop = table.recompute_stop(lo, hi)
        assert lo < stop < hi and table.compute[stop] and not table.keeps_own_output(stop)  # a projection
        assert not any(table.kept[i] for i in range(stop + 1, hi))  # nothing after it keeps a tensor
        skipped += float(secs[stop:hi].sum())
    early = recompute_module.policy_kept(table, "blocks", 0, table.n, b, secs, comm, early_stop=True)[2]
    whole = recompute_module.policy_kept(table, "blocks", 0, table.n, b, secs, comm, early_stop=False)[2]
    assert skipped > 0.1 * whole and early == pytest.approx(whole - skipped)
    zb, il = (plan_stages(profile, Plan(pp=2, schedule=s, stages_per_rank=2, microbatches=4, checkpoint="blocks"))
              for s in ("zero-bubble", "interleaved-1f1b"))
    assert (zb.forward_seconds == il.forward_seconds).all()  # the same stages
    assert (zb.recompute_seconds > il.recompute_seconds).all()  # each of whose regions runs whole under zero-bubble


def test_split_backward_schedules_keep_a_recomputed_chunk_until_its_weight_gradient(llama):
    """Under a split-backward schedule a checkpointed chunk recomputes once, at its input gradient, and
    keeps what it recomputed until its weight gradient (`_RecomputeOnce`): priced as the most chunks
    a rank holds between the two, times a chunk's activations without the policy."""
    _, profile = llama
    zb = Plan(pp=2, schedule="zero-bubble", stages_per_rank=2, microbatches=4, checkpoint="blocks")
    waiting = awaiting_weights(zb.schedule, zb.pp, zb.num_microbatches, zb.stages_per_rank)
    assert (waiting >= 1).all() and not awaiting_weights("interleaved-1f1b", 2, 4, 2).any()
    st = plan_stages(profile, zb)
    plain = plan_stages(profile, zb.replace(checkpoint="none"))
    # a stage of blocks recomputes all it would keep without the policy; the first keeps its head's anyway
    assert list(st.recomputed_bytes[1:]) == list(plain.saved_bytes[1:])
    assert 0 < st.recomputed_bytes[0] < plain.saved_bytes[0]
    with_window = predict(profile, zb).memory["activations"]
    without = predict(profile, zb.replace(schedule="interleaved-1f1b")).memory["activations"]
    assert with_window > without
    assert predict(profile, zb).step_seconds < predict(profile, zb.replace(checkpoint="none")).step_seconds * 1.6


def test_schedules_hold_what_torch_schedules_hold():
    # 1F1B: rank r holds pp - r micro-batches; GPipe all; interleaved per torch's warm-up count
    assert [in_flight_chunks("1f1b", 4, 8, 1, r) for r in range(4)] == [4, 3, 2, 1]
    assert [in_flight_chunks("gpipe", 4, 8, 1, r) for r in range(4)] == [8] * 4
    # torch: warmup = (v - 1) * (m / rounds) + 2 * (pp - 1 - r), rounds = m // pp
    assert in_flight_chunks("interleaved-1f1b", 4, 8, 2, 0) == min((2 - 1) * 4 + 2 * 3, 16) + 1
    assert bubble_fraction("1f1b", 4, 12, 1) == pytest.approx(3 / 15)
    assert bubble_fraction("interleaved-1f1b", 4, 12, 2) == pytest.approx(1.5 / 13.5)
    assert bubble_fraction("1f1b", 1, 1, 1) == 0.0


@pytest.mark.parametrize("schedule, pp, m, v", [
    ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 16, 32, 4), ("interleaved-1f1b", 16, 16, 8),
    ("interleaved-1f1b", 4, 5, 3), ("interleaved-1f1b", 8, 20, 4), ("interleaved-1f1b", 2, 3, 2),
    ("zero-bubble", 4, 8, 2), ("zbv", 4, 8, 2), ("dualpipev", 4, 8, 2)])
def test_a_rank_holds_the_bytes_of_the_chunks_torchs_order_leaves_in_flight(schedule, pp, m, v):
    """The activations a rank holds at its peak, each stage keeping its own bytes per micro-batch: a
    walk over torch's own action order (forward takes its stage's bytes, a full or weight backward gives
    them back) and the planner's `held_activations` (interleaved 1F1B in closed form) agree for any
    bytes; with equal stages it is the count of chunks in flight; with unequal ones less than that
    count times the largest stage (what the planner priced before: 56 GiB for 33 on 405B's stages)."""
    rng = np.random.default_rng(pp * 1000 + m * 10 + v)
    orders = rank_actions(schedule, pp, m, v)
    for _ in range(10):
        saved = rng.integers(1, 10_000, pp * v)
        walked = []
        for actions in orders:
            held = peak = 0
            for kind, stage, _ in actions:
                held += saved[stage] if kind == "F" else -saved[stage] if kind in ("B", "W") else 0
                peak = max(peak, held)
            walked.append(peak)
        assert list(held_activations(schedule, pp, m, v, saved)) == walked
    same = held_activations(schedule, pp, m, v, np.full(pp * v, 7))
    assert list(same) == [7 * in_flight_chunks(schedule, pp, m, v, r) for r in range(pp)]
    if schedule == "interleaved-1f1b":
        uneven = np.ones(pp * v, dtype=np.int64)
        uneven[0] = 100  # rank 0's first local stage (an embedding, a head) keeps far more than its others
        assert held_activations(schedule, pp, m, v, uneven)[0] < 0.8 * 100 * in_flight_chunks(schedule, pp, m, v, 0)


def test_search_ranks_fitting_plans_and_says_why_others_are_left_out(gpt):
    _, profile = gpt
    result = search(profile, 8, 80 * 2**30, load_hardware("h100"))
    assert result.fits and result.plans
    times = [e.step_seconds for e in result.plans]
    assert times == sorted(times)
    assert all(e.memory["total"] <= 80 * 2**30 for e in result.plans)
    # gpt has 4 heads: tp=8 cannot split them, and every plan with it is left out with that reason
    assert any("4 heads cannot be split over tp=8" in reason for reason in result.left_out)
    assert all(e.plan.tp in (1, 2, 4) for e in result.plans)


def test_nothing_fits_names_the_part_and_a_device_count_that_fits(gpt):
    _, profile = gpt
    need = predict(profile, Plan()).memory["total"]
    result = search(profile, 1, need // 3, load_hardware("h100"))
    assert not result.fits and result.closest is not None
    assert result.too_large in result.closest.memory
    assert result.devices_needed is not None and result.devices_needed > 1
    again = search(profile, result.devices_needed, need // 3, load_hardware("h100"))
    assert again.fits, "the device count given is enough"


def test_plan_command_json_and_plan_file(tmp_path):
    out = tmp_path / "plan.json"
    r = cli("plan", EXAMPLES / "mlp.py", "--gpus", "4", "--hardware", "cpu", "--json", "--out", out)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["fits"] and result["search_seconds"] > 0
    best = result["plans"][0]
    assert set(best["plan"]) >= {"tp", "pp", "dp", "fsdp", "microbatches", "schedule", "checkpoint", "autocast"}
    assert set(best["memory"]) >= {"parameters", "gradients", "optimizer_state", "activations", "outputs_and_loss", "total"}
    assert best["step_seconds"] > 0 and 0 < best["mfu"] < 1
    plan = Plan.load(out)
    assert plan.world_size == 4 and (plan.tp, plan.pp, plan.dp) == tuple(best["plan"][k] for k in ("tp", "pp", "dp"))
    t = cli("transform", EXAMPLES / "mlp.py", "--plan", out, "--json")
    assert t.returncode == 0, t.stderr
    assert len(json.loads(t.stdout)["stages"]) == plan.num_stages
    both = cli("transform", EXAMPLES / "mlp.py", "--plan", out, "--pp", "2")
    assert both.returncode == 2 and "drop --pp" in both.stderr


def test_planning_errors_are_one_line(tmp_path):
    bad = tmp_path / "hw.json"
    bad.write_text('{"name": "x"}')
    for args, message in (
        (["--hardware", "tpu"], "neither a built-in profile"),
        (["--hardware", bad], "lacks memory_bytes"),
        (["--gpu-memory", "0"], "memory"),
    ):
        r = cli("plan", EXAMPLES / "mlp.py", "--gpus", "2", *args)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(GraphsplitError, match="cannot read plan file"):
        Plan.load(tmp_path / "missing.json")


def test_plan_model_on_one_device_is_the_five_parts():
    loaded = load_model(str(EXAMPLES / "mlp.py"))
    result, profile = plan_model(loaded, 1, 80 * 2**30, CPU)
    one = result.plans[0]
    assert one.plan.world_size == 1
    params = sum(p.numel() * p.element_size() for p in loaded.build("meta").parameters())
    assert one.memory["parameters"] == params and one.memory["gradients"] == params
    assert one.memory["optimizer_state"] == 2 * params


def test_compiled_stages_price_fused_elementwise_runs(llama):
    """--compile: each run of ops between two matmuls is one kernel reading what it takes from outside
    once and writing what leaves it; matmul-class ops cost what they cost eagerly."""
    from graphsplit.planner.stages import fused_groups, op_seconds

    _, profile = llama
    table = profile.table(Plan())
    eager, fused = op_seconds(table, 2, CPU), op_seconds(table, 2, CPU, fused=True)
    assert (fused[table.compute] == eager[table.compute]).all()
    groups = fused_groups(table)
    assert (groups[table.compute] == -1).all() and groups.max() > 10
    assert fused[~table.compute].sum() < 0.8 * eager[~table.compute].sum()
    plain, compiled = predict(profile, Plan(pp=2)), predict(profile, Plan(pp=2, compile=True))
    assert compiled.step_seconds < plain.step_seconds
    assert {k: v for k, v in compiled.memory.items() if k not in ("activations", "total")} == \
        {k: v for k, v in plain.memory.items() if k not in ("activations", "total")}


@pytest.mark.slow
def test_compiled_stages_keep_what_the_partitioner_keeps(llama):
    """Under --compile AOTAutograd recomputes a compiled piece's cheap ops in backward where saving the
    piece's inputs costs fewer bytes: priced so (`OpTable.for_compiled`), and measured here by running
    the program both ways in this process: the bytes autograd saves in a step, eager against compiled
    (0.77x for the Llama example in bf16), against the planner's ratio of activations."""
    _, profile = llama
    table = profile.table(Plan(autocast="bf16"))
    compiled = table.for_compiled()
    inside = table.storage_maker >= 0
    assert (compiled.storage[0] <= table.storage[0]).all() and compiled.storage[0].sum() < 0.9 * table.storage[0].sum()
    assert inside.mean() > 0.5  # most kept storages are known by the op that made them
    eager, fused = (predict(profile, Plan(autocast="bf16", compile=c)).memory["activations"] for c in (False, True))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "compiled_saved.py")],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    measured_eager, measured_fused = (int(w) for w in out.stdout.split()[-2:])
    assert measured_fused < 0.85 * measured_eager
    assert fused / eager == pytest.approx(measured_fused / measured_eager, abs=0.06)


def test_the_profile_cuts_a_seq_first_model_along_its_batch():
    """The planner profiles at 2 and 4 samples along the batch the graph holds ([sequence, batch]: dim 1)."""
    from graphsplit.planner.profile import start_profile

    profile = start_profile(load_model(str(MODELS / "seq_first.py")))
    assert profile.batch == 4
    assert [tuple(t.shape) for t in profile.source.inputs[0]] == [(8, 2, 16)]
    assert [tuple(t.shape) for t in profile.source.inputs[1]] == [(8, 4, 16)]


@pytest.mark.timeout(120)
def test_a_model_the_profile_cannot_run_is_refused_in_one_line_not_hung(tmp_path):
    """word_language_model's nn.TransformerEncoder reads its mask's values: the forked profile worker
    fails (after this process ran that module on CPU zeros: no OpenMP deadlock in the child) and the
    reason comes back."""
    r = subprocess.run([sys.executable, "-m", "graphsplit", "plan", str(MODELS / "outside" / "word_language_model_tiny.py"),
                        "--gpus", "2", "--gpu-memory", "1GiB"], capture_output=True, text=True, timeout=110)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error: tp=1: profiling failed: RuntimeError: Tensor.item() cannot be called on meta tensors" in r.stderr


def test_more_micro_batches_than_samples_is_refused_not_priced_at_zero(gpt):
    """A plan cutting each replica's batch into more micro-batches than it has samples was priced at zero
    samples per micro-batch (free compute); it is one line naming the counts."""
    _, profile = gpt
    with pytest.raises(GraphsplitError, match="16 micro-batches per replica but each of dp=1 replicas has 8 sample"):
        predict(profile, Plan(pp=2, microbatches=16))


def test_zero_bubble_schedules_are_searched_and_a_chosen_one_trains_the_model(llama):
    """The search proposes the zero-bubble schedules (priced from torch's own action order, their dp
    collectives not overlapped); where one is the best of its shape it runs and equals the untouched
    model (each schedule the planner picks runs under --check)."""
    from graphsplit.launch.parity import check_locally

    loaded, profile = llama
    result = search(profile, 4, 80 * 2**30, load_hardware("h100"))
    chosen = [e.plan for e in result.plans if e.plan.schedule in ("zero-bubble", "zbv", "dualpipev")]
    assert chosen, "no zero-bubble plan among the fitting ones"
    plan = next(p for p in chosen if not p.compile)
    same_shape = [e for e in result.plans if (e.plan.pp, e.plan.tp, e.plan.dp) == (plan.pp, plan.tp, plan.dp)]
    bubbles = {e.plan.schedule: e.bubble for e in same_shape}
    assert bubbles[plan.schedule] < bubbles.get("1f1b", 1.0)
    _, cmp = check_locally(loaded, plan)
    assert cmp.ok, (plan, cmp.failures)


def test_long_sequences_get_context_parallel_plans_and_the_reason():
    """Llama 3 70B's shape at 131,072 tokens, 8 sequences a step on 64 H100s: the search tries cp (drawn
    from dp) and its best plan cuts each sequence, faster than any plan without it, and says so; at
    8,192 tokens with a batch that fills dp, cp is not tried."""
    from graphsplit.planner.search import LONG_SEQUENCE, cp_degrees
    from graphsplit.report.planning import why_cp

    hw = load_hardware("h100")
    loaded = load_model(str(ROOT / "bench" / "models" / "llama3_70b_128k.py"))
    result, profile = plan_model(loaded, 64, hw.memory_bytes, hw)
    assert profile.sequence == 131072
    best = result.plans[0]
    assert best.plan.cp > 1 and best.time["cp_exchange"] > 0
    without = next(e for e in result.plans if e.plan.cp == 1)
    assert without.step_seconds > best.step_seconds
    assert why_cp(result).startswith(f"cp{best.plan.cp}: each sample's 131,072 tokens cut over {best.plan.cp} ranks")
    # cp is priced as 1/cp of each sample per rank: the same plan at cp 2 computes about half per rank
    one = estimate(without.plan.replace(pp=1, dp=8, microbatches=None, schedule="1f1b", stages_per_rank=1),
                   plan_stages(profile, without.plan.replace(pp=1, dp=8, microbatches=None, schedule="1f1b",
                                                             stages_per_rank=1)), hw, 8, 131072,
                   profile.model_flops_per_sample)
    cut = one.plan.replace(dp=16, cp=2)
    two = estimate(cut, plan_stages(profile, cut), hw, 8, 131072, profile.model_flops_per_sample)
    assert 0.45 < two.time["compute_and_tp"] / one.time["compute_and_tp"] < 0.6
    assert cp_degrees(8, 2048, 8192) == [1] and cp_degrees(8, 4, 8192) == [1, 2, 4, 8]
    assert cp_degrees(8, 8, LONG_SEQUENCE) == [1, 2, 4, 8] and cp_degrees(8, 8, 0) == [1]


def test_a_one_sample_model_is_priced_with_its_flops(tmp_path):
    """With one sample no dim scales with the batch: every op's FLOPs are the constant part of the table,
    which the model's FLOPs per sample (and so its MFU) left out: 0% for any plan."""
    mfu = {}
    for batch in (1, 2):
        path = tmp_path / f"llama_{batch}.py"
        path.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'bench' / 'models')!r})\nfrom llama3 import model_file\n"
                        f"build_model, example_inputs, example_target, loss_fn = model_file(dict(n_layers=2, max_seq_len=32), {batch})\n")
        profile = profile_model(load_model(str(path)))
        mfu[batch] = profile.model_flops_per_sample
    assert mfu[1] > 0 and mfu[1] == pytest.approx(mfu[2], rel=1e-6)
