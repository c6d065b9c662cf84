"""--async-tp: sequence parallelism's collectives as rings beside their matmuls, and the planner's price of them.

The rings must compute what the plain collectives compute (outputs, every input's gradient, on every
rank), run as many collectives as they replace, and train to the untouched model's gradients; the
planner must price exactly the collectives the pass rewrites, sized as the program sends them.
"""

from collections import Counter

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.collectives import collectives, count_table
from graphsplit.backends import threads
from graphsplit.cli_options import plan_from
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.ops import async_tp
from graphsplit.ops import tp as tpops
from graphsplit.ops.tp_comm import TPComm
from graphsplit.planner.hardware import load_hardware
from graphsplit.planner.profile import build_all_tables, start_profile
from graphsplit.planner.rings import DROPPED
from graphsplit.planner.stages import ring_op_seconds, tp_op_seconds
from graphsplit.report.summary import summarize
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES, MODELS

ASYNC = Plan(tp=2, sequence_parallel=True, async_tp=True)


def graphs(program) -> list[fx.Graph]:
    return [m.graph for st in program.stages for m in st.gm.modules() if isinstance(m, fx.GraphModule)]


def targets(program) -> Counter:
    return Counter(n.target for g in graphs(program) for n in g.nodes if n.op == "call_function")


def test_the_plan_field_is_validated_and_the_flag_implies_sequence_parallelism():
    with pytest.raises(GraphsplitError, match=r"Plan.async_tp: .*--sequence-parallel"):
        Plan(tp=2, async_tp=True)
    with pytest.raises(GraphsplitError, match=r"Plan.async_tp: must be true or false"):
        Plan(tp=2, sequence_parallel=True, async_tp=1)
    assert Plan.from_dict(ASYNC.to_dict()) == ASYNC
    plan, given = plan_from({"tp": 2, "async_tp": True})
    assert given and plan.sequence_parallel and plan.async_tp


@pytest.mark.parametrize("tp", [2, 4])
def test_the_rings_equal_the_plain_collectives(tp):
    """Threads at tp 2 and 4, fp64: q/k-like column linears sharing one gather (one with a bias), a
    row linear with a bias into the reduce-scatter; the output and every gradient on every rank equal
    the plain program's, and the rings count as the collectives they replace (one backward re-gather
    of the shard for all the column weights, as against one per linear)."""
    g = torch.Generator().manual_seed(0)
    dt = torch.float64
    x = torch.randn(2, 8, 6, generator=g, dtype=dt)
    w1, w2, b1 = torch.randn(8, 6, generator=g, dtype=dt), torch.randn(4, 6, generator=g, dtype=dt), torch.randn(8, generator=g, dtype=dt)
    wr, br = torch.randn(6, 12 // tp * tp, generator=g, dtype=dt), torch.randn(6, generator=g, dtype=dt)
    upstream = torch.randn(2, 8, 6, generator=g, dtype=dt)
    hub = threads.ThreadHub(tp)

    def work(rank, ring):
        comm = TPComm(tp)
        comm.bind(threads.ThreadLink(hub, rank))
        leaf = lambda t, dim: t.chunk(tp, dim)[rank].clone().requires_grad_(True)  # noqa: E731
        xs, a, bb, c, r = leaf(x, 1), leaf(w1, 0), leaf(b1, 0), leaf(w2, 0), leaf(wr, 1)
        rb = br.clone().requires_grad_(True)
        if ring:
            o1, o2 = async_tp.ring_column_linears(xs, (a, c), (bb, None), 1, comm)
        else:
            gathered = tpops.gather_for_column(xs, 1, comm)
            o1 = tpops.column_linear_from_seq_shard(gathered, xs, a, bb, 1, comm)
            o2 = tpops.column_linear_from_seq_shard(gathered, xs, c, None, 1, comm)
        h = torch.cat([o1.tanh(), o2.sin()], -1)[..., : r.shape[1]]
        y = async_tp.ring_linear_reduce_scatter(h, r, rb, 1, comm) if ring else \
            tpops.reduce_scatter_to_tp(F.linear(h, r, rb), 1, comm)
        (y * upstream.chunk(tp, 1)[rank]).sum().backward()
        return [y.detach(), xs.grad, a.grad, bb.grad, c.grad, r.grad, rb.grad], dict(comm.counts)

    plain = threads.run_ranks(hub, lambda r: work(r, False))
    rings = threads.run_ranks(hub, lambda r: work(r, True))
    for rank in range(tp):
        for got, want in zip(rings[rank][0], plain[rank][0]):
            torch.testing.assert_close(got, want)
        assert rings[rank][1] == {("forward", "all_gather"): 1, ("forward", "reduce_scatter"): 1,
                                  ("backward", "all_gather"): 2, ("backward", "reduce_scatter"): 1}
        assert plain[rank][1][("backward", "all_gather")] == 3  # each column linear's, and the row's gradient


@pytest.mark.parametrize("spec, plan", [
    ("gpt.py", ASYNC), ("llama.py", ASYNC.replace(autocast="bf16")),
    ("llama.py", ASYNC.replace(pp=2, checkpoint="selective")), ("gpt.py", ASYNC.replace(pp=2, checkpoint="blocks")),
    ("hf_llama.py", ASYNC),
], ids=["gpt-tp2", "llama-tp2-bf16", "llama-tp2-pp2-selective", "gpt-tp2-pp2-blocks", "hf_llama-tp2"])
def test_async_tp_equals_the_untouched_model(spec, plan):
    """Loss, outputs and every rank's gradients against the untouched model (threads); every gather of
    the tokens and every row linear's reduce-scatter became a ring (inside checkpointed regions too),
    and the collectives run per block are sequence parallelism's."""
    path = EXAMPLES / spec if (EXAMPLES / spec).exists() else MODELS / spec
    loaded = load_model(str(path))
    program, cmp = check_locally(loaded, plan)
    assert cmp.ok, cmp.failures
    found = targets(program)
    assert found[async_tp.ring_column_linears] and found[async_tp.ring_linear_reduce_scatter]
    assert not found[tpops.gather_for_column] and not found[tpops.reduce_scatter_to_tp]
    assert not found[tpops.column_linear_from_seq_shard]
    if spec == "gpt.py" and plan.pp == 1:
        blocks = {k: v for k, v in count_table(collectives(graphs(program)))["per_block"].items() if k.startswith("h.")}
        for name, counts in blocks.items():
            assert counts["forward"] == {"all_gather": 2, "reduce_scatter": 2}, name
            assert counts["backward"]["all_gather"] == 4 and counts["backward"]["reduce_scatter"] == 2, name


def test_what_is_not_a_ring_site_keeps_its_collectives():
    """Under rowwise float8 a gather read by float8 linears is no ring site (torchao gathers rowwise tokens
    in the high dtype, each linear casting them): llama's such gathers stay plain gathers, the others
    become rings. Under tensorwise the float8 gathers (passes/float8_gather.py) become rings of float8
    chunks (ops/float8_ring.py), and no ring reads a float8 linear's high-precision tokens."""
    pytest.importorskip("torchao")
    from graphsplit.ops.float8 import float8_linear
    from graphsplit.ops.float8_gather import float8_gathered_linears, float8_linear_reduce_scatter
    from graphsplit.ops.float8_ring import (
        ring_float8_gathered_linears,
        ring_float8_linear_reduce_scatter,
    )

    loaded = load_model(str(EXAMPLES / "llama.py"))
    program = rewrite_loaded(loaded, ASYNC.replace(fp8="rowwise", autocast="bf16")).program
    found = targets(program)
    assert found[float8_linear] and found[tpops.gather_for_column] and found[async_tp.ring_column_linears]
    for g in graphs(program):
        for node in g.nodes:
            if node.target is tpops.gather_for_column:  # read by float8 linears alone
                assert {u.target for u in node.users} == {float8_linear}
    program = rewrite_loaded(loaded, ASYNC.replace(fp8="tensorwise", autocast="bf16")).program
    found = targets(program)
    assert found[ring_float8_gathered_linears] and found[ring_float8_linear_reduce_scatter]
    assert not found[tpops.gather_for_column] and not found[float8_gathered_linears]
    assert not found[float8_linear_reduce_scatter] and not found[tpops.reduce_scatter_to_tp]


@pytest.mark.parametrize("example", ["llama.py", "gpt.py"])
def test_float8_rings_equal_torchao(example):
    """`--fp8 tensorwise --async-tp` at tp 2 (threads): the program's every float8 gather a ring of float8
    chunks, and the local check against torchao's float8 model (outputs, loss, every rank's gradients)
    passes."""
    pytest.importorskip("torchao")
    from graphsplit.ops.float8_ring import (
        ring_float8_gathered_linears,
        ring_float8_linear_reduce_scatter,
    )

    loaded = load_model(str(EXAMPLES / example))
    program, cmp = check_locally(loaded, ASYNC.replace(fp8="tensorwise"))
    assert cmp.ok, cmp.failures[:3]
    found = targets(program)
    assert found[ring_float8_gathered_linears] and found[ring_float8_linear_reduce_scatter]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_async_tp_dp2_tp2():
    """Real gloo ranks: each ring step a batch_isend_irecv between processes; step 1's gradients on
    every rank and every step's loss match the untouched model on the whole batch."""
    lines: list[str] = []
    cmp = run_training(str(EXAMPLES / "llama.py"), ASYNC.replace(dp=2), RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("rank 3" in k for k in cmp.max_diff)


@pytest.fixture(scope="module")
def gpt_sp_profile():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    profile = start_profile(loaded)
    profile.add(build_all_tables(profile.source, ((2, True),)))
    return loaded, profile


def test_the_table_sizes_tp_collectives_as_the_program_sends_them(gpt_sp_profile):
    """Per direction and kind, the table's bytes equal what the program's own count says it moves
    (report/summary.py); the loss's three all-reduces of one number a token live in the loss graph."""
    loaded, profile = gpt_sp_profile
    table = profile.table(Plan(tp=2, sequence_parallel=True))
    b = loaded.args[0].shape[0]
    volume: Counter = Counter()
    for _op, direction, kind, per_sample, constant, *_ in table.collectives:
        volume[(direction, kind)] += per_sample * b + constant
    program = summarize(rewrite_loaded(loaded, Plan(tp=2, sequence_parallel=True)).program)["collective_bytes"]
    want = {(d, k): v for d, kinds in program.items() for k, v in kinds.items() if not (d, k) == ("forward", "all_reduce")}
    assert dict(volume) == want


def test_the_planner_prices_the_rings_the_pass_writes(gpt_sp_profile):
    """Each gather read by column linears and each row linear's reduce-scatter is tagged: forward and
    backward rings over those linears, the later linears' re-gathers dropped (one ring does them). With
    nothing to hide behind a ring costs what its collective did, less the re-gathers; with the matmuls
    it costs (tp - 1) x (step - overlap x min(step, matmul / tp)) and never more than the plain collective."""
    loaded, profile = gpt_sp_profile
    table = profile.table(Plan(tp=2, sequence_parallel=True))
    hw = load_hardware("h100")
    b = loaded.args[0].shape[0]
    tags = [c for c in table.collectives if c[5] is not None]
    dropped = [c for c in tags if c[5] == DROPPED]
    program = rewrite_loaded(loaded, ASYNC).program
    found = targets(program)
    sites = found[async_tp.ring_column_linears] + found[async_tp.ring_linear_reduce_scatter]
    assert len(tags) - len(dropped) == 3 * found[async_tp.ring_column_linears] + 2 * found[async_tp.ring_linear_reduce_scatter]
    assert sites and len(dropped) == 0  # GPT's fused qkv and fc: one linear per gather
    plain = tp_op_seconds(table, b, hw)
    exposed = ring_op_seconds(table, b, hw, torch.zeros(table.n).numpy(), "none")
    assert exposed.sum() == pytest.approx(plain.sum())
    compute = torch.full((table.n,), 1e-3, dtype=torch.float64).numpy()
    hidden = ring_op_seconds(table, b, hw, compute, "1ms")
    assert (hidden <= plain + 1e-12).all() and hidden.sum() < plain.sum()
    once = Counter(c[0] for c in tags)
    op, _, _, per_sample, constant, ring, *_ = next(c for c in tags if once[c[0]] == 1 and c[5] != DROPPED)
    step = (ring[0] * b + ring[1]) / 2 / hw.intra_node_bandwidth / hw.link_efficiency + hw.intra_node_latency
    behind = ring[3] * 1e-3 * len(ring[2]) / 2
    others = plain[op] - (0.5 * (per_sample * b + constant) / hw.intra_node_bandwidth / hw.link_efficiency
                          + hw.intra_node_latency)
    assert hidden[op] == pytest.approx(others + step - hw.overlap_efficiency * min(step, behind))
    assert 0 < hw.overlap_efficiency < 1 and "torchtitan" in hw.sources["overlap_efficiency"]


def test_llama_qkv_rings_drop_the_later_re_gathers():
    """Llama's separate q, k, v (and gate, up) read one gather: the table keeps one backward re-gather
    per site, the others tagged as done by its ring."""
    loaded = load_model(str(EXAMPLES / "llama.py"))
    profile = start_profile(loaded)
    profile.add(build_all_tables(profile.source, ((2, True),)))
    table = profile.table(Plan(tp=2, sequence_parallel=True, autocast="bf16"))
    dropped = [c for c in table.collectives if c[5] == DROPPED]
    columns = targets(rewrite_loaded(loaded, ASYNC.replace(autocast="bf16")).program)[async_tp.ring_column_linears]
    # per block: q, k, v (2 dropped) and gate, up (1 dropped); the LM head's gather has one linear
    assert len(dropped) == 3 * (columns - 1) // 2
