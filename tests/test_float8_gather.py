"""--fp8 tensorwise with --sequence-parallel: the tokens cast once on the shard and gathered in float8.

The float8 gather must compute what the plain float8 linears compute on the gathered tokens (the same
float8 values and scales: outputs and every gradient on every rank), move a byte an element, run one
backward re-gather for all its linears, train to torchao's model's gradients, and be priced as the
program runs it (bytes, casts, the shard kept in float8, no ring where a float8 linear is).
"""

import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.fx as fx

from graphsplit import Plan
from graphsplit.backends import threads
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.ops import float8_gather
from graphsplit.ops import tp as tpops
from graphsplit.ops.async_tp import ring_column_linears
from graphsplit.ops.float8 import float8_linear
from graphsplit.ops.float8_gather import float8_gathered_linears, float8_linear_reduce_scatter
from graphsplit.ops.float8_ring import (
    ring_float8_gathered_linears,
    ring_float8_linear_reduce_scatter,
)
from graphsplit.ops.tp_comm import TPComm
from graphsplit.planner.profile import build_all_tables, start_profile
from graphsplit.planner.rings import DROPPED
from graphsplit.report.summary import summarize
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES

pytest.importorskip("torchao")

SP8 = Plan(tp=2, sequence_parallel=True, fp8="tensorwise")


def graphs(program) -> list[fx.Graph]:
    return [m.graph for st in program.stages for m in st.gm.modules() if isinstance(m, fx.GraphModule)]


def targets(program) -> Counter:
    return Counter(n.target for st in program.stages for m in st.gm.modules() if isinstance(m, fx.GraphModule)
                   for n in m.graph.nodes if n.op == "call_function")


class _Recording(threads.ThreadLink):
    """A thread link that notes the dtype of every tensor it all-gathers."""

    def __init__(self, hub: threads.ThreadHub, rank: int, seen: list[torch.dtype]) -> None:
        super().__init__(hub, rank)
        self.seen = seen

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.seen.append(x.dtype)
        return super().all_gather(x)

    def shift(self, x: torch.Tensor):  # a ring step
        self.seen.append(x.dtype)
        return super().shift(x)


def _run(tp: int, fused: bool | str):
    """Two column linears (one with a bias) reading one gather of a sequence shard at tp `tp`, then a
    loss on their outputs: (each rank's outputs and gradients, its collective counts, the dtypes gathered)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 32, generator=g)
    x[:, : 8 // tp] *= 8  # the first rank's shard holds the largest values: its amax is not the others'
    w1, b1, w2 = torch.randn(64, 32, generator=g), torch.randn(64, generator=g), torch.randn(32, 32, generator=g)
    upstream = torch.randn(2, 8, 96 // tp, generator=g)
    hub = threads.ThreadHub(tp)

    def work(rank):
        seen: list[torch.dtype] = []
        comm = TPComm(tp)
        comm.bind(_Recording(hub, rank, seen))
        leaf = lambda t, dim: t.chunk(tp, dim)[rank].clone().requires_grad_(True)  # noqa: E731
        xs, a, bb, c = leaf(x, 1), leaf(w1, 0), leaf(b1, 0), leaf(w2, 0)
        if fused == "compiled":  # the ring, its casts compiled kernels (under --compile)
            o1, o2 = ring_float8_gathered_linears(xs, (a, c), (bb, None), 1, comm, "tensorwise", compiled=True)
        elif fused:
            op = ring_float8_gathered_linears if fused == "ring" else float8_gathered_linears
            o1, o2 = op(xs, (a, c), (bb, None), 1, comm, "tensorwise")
        else:
            gathered = tpops.gather_for_column(xs, 1, comm)
            o1 = float8_linear(gathered, a, bb, comm, "tensorwise", "column", xs, 1)
            o2 = float8_linear(gathered, c, None, comm, "tensorwise", "column", xs, 1)
        out = torch.cat([o1, o2], -1)
        (out * upstream).sum().backward()
        return [out.detach(), xs.grad, a.grad, bb.grad, c.grad], dict(comm.counts), seen

    return threads.run_ranks(hub, work)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_float8_gather_equals_the_plain_float8_linears(tp):
    """Threads at tp 2 and 4: the outputs and every gradient on every rank equal the plain float8
    linears' on the gathered tokens (the same float8 values, the same scales); the tokens move as bytes,
    one gather forward and one backward for both linears (the plain program re-gathers per linear)."""
    plain, fused = _run(tp, False), _run(tp, True)
    for rank in range(tp):
        for got, want in zip(fused[rank][0], plain[rank][0]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        counts = fused[rank][1]
        assert counts[("forward", "all_gather")] == 1 and counts[("backward", "all_gather")] == 1
        assert counts[("backward", "reduce_scatter")] == 1
        assert plain[rank][1][("backward", "all_gather")] == 2
        # the shard's amax, reduced once more than the plain linears reduce
        assert counts[("fwd", "all_reduce")] == plain[rank][1][("fwd", "all_reduce")] + 1
        assert fused[rank][2] and set(fused[rank][2]) == {torch.uint8}
        assert set(plain[rank][2]) == {torch.float32}


def _run_row(tp: int, fused: bool | str):
    """A row linear with a bias into sequence parallelism's reduce-scatter at tp `tp`, its output's
    gradient from a loss on the shard: (each rank's output and gradients, counts, dtypes gathered)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 64, generator=g)
    w, b = torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    upstream = torch.randn(2, 8, 32, generator=g)
    upstream[:, : 8 // tp] *= 8  # the first rank's shard of the gradient holds its largest values
    hub = threads.ThreadHub(tp)

    def work(rank):
        seen: list[torch.dtype] = []
        comm = TPComm(tp)
        comm.bind(_Recording(hub, rank, seen))
        xs = x.chunk(tp, -1)[rank].clone().requires_grad_(True)
        ws = w.chunk(tp, 1)[rank].clone().requires_grad_(True)
        bs = (b / tp).clone().requires_grad_(True)  # each rank's share of the bias, summed by the reduce-scatter
        if fused == "compiled":
            y = ring_float8_linear_reduce_scatter(xs, ws, bs, 1, comm, "tensorwise", compiled=True)
        elif fused:
            op = ring_float8_linear_reduce_scatter if fused == "ring" else float8_linear_reduce_scatter
            y = op(xs, ws, bs, 1, comm, "tensorwise")
        else:
            y = tpops.reduce_scatter_to_tp(float8_linear(xs, ws, bs, comm, "tensorwise", "row"), 1, comm)
        (y * upstream.chunk(tp, 1)[rank]).sum().backward()
        return [y.detach(), xs.grad, ws.grad, bs.grad], dict(comm.counts), seen

    return threads.run_ranks(hub, work)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_row_linears_gradient_gathered_in_float8_equals_the_plain_one(tp):
    """Threads at tp 2 and 4: a float8 row linear's reduce-scatter whose backward gathers the output's
    gradient in float8 (cast on each shard with the tp-reduced amax) gives the plain program's output and
    every gradient on every rank; the gradient moves as bytes."""
    plain, fused = _run_row(tp, False), _run_row(tp, True)
    for rank in range(tp):
        for got, want in zip(fused[rank][0], plain[rank][0]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
        assert fused[rank][1][("backward", "all_gather")] == 1 == plain[rank][1][("backward", "all_gather")]
        assert set(fused[rank][2]) == {torch.uint8} and set(plain[rank][2]) == {torch.float32}


@pytest.mark.parametrize("tp", [2, 4])
def test_the_float8_rings_equal_the_float8_gathers(tp):
    """Threads at tp 2 and 4, --async-tp under tensorwise float8: the column linears' ring of float8 chunks
    and the row linear's reduce-scatter ring (its gradient's float8 chunks gathered in a ring) give the
    float8 gathers' outputs and every gradient on every rank (the same float8 values, each chunk with its
    tensor's one scale; the weight gradients summed chunk by chunk in fp32), and move bytes alike: one
    gather forward, one re-gather and one reduce-scatter backward, every chunk uint8."""
    for run in (_run, _run_row):
        gathered, ring = run(tp, True), run(tp, "ring")
        for rank in range(tp):
            for got, want in zip(ring[rank][0], gathered[rank][0]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
            assert ring[rank][1] == gathered[rank][1]
            # the float8 chunks as bytes; the partial sums (forward, rows; backward, columns) in their dtype
            assert set(ring[rank][2]) == {torch.uint8, torch.float32}
            assert ring[rank][2].count(torch.uint8) == (tp - 1) * (2 if run is _run else 1)


def test_the_rings_compiled_casts_equal_torchaos_eager_casts():
    """Under --compile a ring op's float8 casts (inside the eager op) are compiled kernels, an amax and a
    scaled cast (`_cast_kernels`): at tp 2 the outputs and every gradient on every rank are exactly the
    eager casts' (the same float8 values and scales, the activations', the transposed weights' and the
    output gradients'), and the kernels were compiled once per dtype pair, not per shape."""
    from torch._dynamo.utils import counters
    from torchao.float8.float8_training_tensor import GemmInputRole

    from graphsplit.ops.float8 import _cast, _config

    # dynamo compiling in one thread makes torch.compiler.is_compiling() true in the others (whose
    # communicators then keep no counts) and races their guards: the kernels are compiled here first, one
    # per dtype pair (fp32 operands, e4m3 and e5m2), on a shape the rings never cast
    c = _config("tensorwise", True)
    with torch.no_grad():
        for config in (c.cast_config_input, c.cast_config_grad_output):
            want = _cast(torch.randn(5, 3) * 9, config, GemmInputRole.INPUT, -1, None, ("tensorwise", True), None, "fwd")
            got = _cast(torch.randn(5, 3) * 9, config, GemmInputRole.INPUT, -1, None, ("tensorwise", True), None,
                        "fwd", compiled=True)
            assert got._data.dtype == want._data.dtype == config.target_dtype
    compiled_graphs = counters["stats"]["unique_graphs"]
    for run in (_run, _run_row):
        eager, compiled = run(2, "ring"), run(2, "compiled")
        for rank in range(2):
            for got, want in zip(compiled[rank][0], eager[rank][0]):
                assert torch.equal(got, want)
            assert compiled[rank][1] == eager[rank][1]
    # the shards, weights (transposed) and gradients, of other shapes and layouts, compiled nothing more
    assert counters["stats"]["unique_graphs"] == compiled_graphs


def test_the_rings_cast_with_compiled_kernels_where_the_program_compiles():
    """The async_tp pass gives every float8 ring op `compiled=True` under --compile and nothing without it."""
    loaded = load_model(str(EXAMPLES / "llama.py"))
    for compiled in (False, True):
        program = rewrite_loaded(loaded, SP8.replace(async_tp=True, compile=compiled)).program
        rings = [n for g in graphs(program) for n in g.nodes
                 if n.target in (ring_float8_gathered_linears, ring_float8_linear_reduce_scatter)]
        assert {ring_float8_gathered_linears, ring_float8_linear_reduce_scatter} <= {n.target for n in rings}
        assert all(n.kwargs == ({"compiled": True} if compiled else {}) for n in rings), [n.kwargs for n in rings]


def test_shards_cast_with_their_own_scale_would_be_wrong(monkeypatch):
    """The shard's amax reduced over tp is what makes its cast the gathered tokens' cast: without it the
    rank whose shard is largest scales differently, and the outputs move."""
    plain = _run(2, False)
    monkeypatch.setattr(float8_gather, "_cast_shard", lambda shard, recipe, comm: _alone(shard, recipe))
    alone = _run(2, True)
    assert not torch.allclose(alone[1][0][0], plain[1][0][0], rtol=1e-3, atol=1e-3)


def _alone(shard, recipe):
    from torchao.float8.float8_training_tensor import GemmInputRole

    from graphsplit.ops.float8 import _cast, _config

    return _cast(shard, _config(*recipe).cast_config_input, GemmInputRole.INPUT, -1, 0, recipe, None, "fwd")


@pytest.mark.parametrize("example", ["llama.py", "gpt.py"])
def test_the_program_gathers_float8_and_equals_torchao(example):
    """Llama's q, k, v and gate, up (separate linears on one gather) and GPT's fused qkv: every gather
    read by float8 column linears alone is a float8 gather, rowwise keeps the plain gathers, and the
    local check against torchao's float8 model passes."""
    loaded = load_model(str(EXAMPLES / example))
    program, cmp = check_locally(loaded, SP8)
    assert cmp.ok, cmp.failures[:3]
    found = targets(program)
    assert found[float8_gathered_linears] and found[float8_linear_reduce_scatter]
    for m in (m for st in program.stages for m in st.gm.modules() if isinstance(m, fx.GraphModule)):
        for node in m.graph.nodes:  # a gather left is read by a linear float8 does not take (llama's small k, v)
            if node.target is tpops.gather_for_column:
                assert any(u.target is not float8_linear for u in node.users), node
    rowwise = targets(rewrite_loaded(loaded, SP8.replace(fp8="rowwise")).program)
    assert not rowwise[float8_gathered_linears] and rowwise[tpops.gather_for_column]
    assert not rowwise[float8_linear_reduce_scatter] and rowwise[tpops.reduce_scatter_to_tp]


@pytest.mark.slow
def test_run_check_with_float8_rings_on_real_processes(tmp_path):
    """`run --fp8 tensorwise --sequence-parallel --async-tp --check` at tp 2 on 2 gloo processes: the float8
    chunks cross processes in rings of point-to-point sends (the plain float8 gathers cross them in
    `test_float8_linears_compile_whole_across_a_real_tp_group`), the check against torchao's model passes
    and the loss falls."""
    r = subprocess.run([sys.executable, "-m", "graphsplit", "run", str(EXAMPLES / "gpt.py"), "--tp", "2", "--fp8",
                        "tensorwise", "--sequence-parallel", "--async-tp", "--steps", "3", "--lr", "0.05", "--check"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "check passed" in r.stdout and "torchao's float8 model" in r.stdout


@pytest.fixture(scope="module")
def llama_sp():
    loaded = load_model(str(EXAMPLES / "llama.py"))
    profile = start_profile(loaded)
    profile.add(build_all_tables(profile.source, ((2, True),)))
    return loaded, profile


def _volume(collectives, b: int, rings: bool = False) -> dict:
    volume: Counter = Counter()
    for _op, direction, kind, per_sample, constant, *rest in collectives:
        if kind in ("cp_gather", "all_to_all"):  # what --cp and --ep would move
            continue
        if rings and rest and rest[0] == DROPPED:  # a re-gather a ring does for another linear
            continue
        volume[(direction, kind)] += per_sample * b + constant
    return dict(volume)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_table_prices_the_gathers_the_program_sends(llama_sp, recipe):
    """Per direction and kind, the float8 table's tp bytes equal what the float8 program's own count says
    it moves (tensorwise: its gathers a byte an element, one backward re-gather a site), with and without
    --async-tp; a ring is priced where the program has one and nowhere else: under --async-tp the bf16
    rings and, tensorwise, the float8 ones (their casts eager, the rest fused under --compile); none at a
    rowwise float8 linear."""
    loaded, profile = llama_sp
    plan = SP8.replace(fp8=recipe)
    b = loaded.args[0].shape[0]
    for rings in (False, True):
        table = profile.table(plan).for_fp8(recipe, rings)
        program = rewrite_loaded(loaded, plan.replace(async_tp=rings)).program
        sent = summarize(program)["collective_bytes"]
        want = {(d, k): v for d, kinds in sent.items() for k, v in kinds.items() if (d, k) != ("forward", "all_reduce")}
        assert _volume(table.collectives, b, rings) == want
        found = targets(program)
        tagged = [c for c in table.collectives if c[5] is not None and c[5] != DROPPED
                  and c[1:3] == ("forward", "all_gather")]
        if rings:
            assert len(tagged) == found[ring_column_linears] + found[ring_float8_gathered_linears]
            assert bool(found[ring_float8_gathered_linears]) == (recipe == "tensorwise")
        else:
            unringed = rewrite_loaded(loaded, plan.replace(async_tp=True)).program
            assert len(tagged) == targets(unringed)[ring_column_linears]


def test_the_table_casts_the_shard_once_and_keeps_it_in_float8(llama_sp):
    """Tensorwise: a site's linears cast the shard once (1/tp of the gathered tokens' bytes, by the first
    linear) where rowwise casts the gathered tokens per linear; the kept shard is a byte an element."""
    loaded, profile = llama_sp
    base = profile.table(SP8)
    tensorwise, rowwise = base.for_fp8("tensorwise"), base.for_fp8("rowwise")
    b = 4
    cast_t, cast_r = tensorwise.at(tensorwise.fp8_cast, b), rowwise.at(rowwise.fp8_cast, b)
    assert cast_t.sum() < cast_r.sum() and (cast_t <= cast_r).all()
    shards = base.fp8_shard_storage
    assert shards.any()
    kept_t, kept_r = tensorwise.storage[0][shards], rowwise.storage[0][shards]
    assert (kept_t * 4 == kept_r).all()  # the fp32 table: four bytes an element, one in float8
    assert (tensorwise.storage[0][~shards] == rowwise.storage[0][~shards]).all()


@pytest.mark.slow
def test_float8_linears_compile_whole_across_a_real_tp_group():
    """What the planner prices as fused under --compile: a float8 linear that agrees its scales over a real
    2-rank tp group (column, row), the float8 gather and the float8 row reduce-scatter compile into one graph
    each (no graph break: the collectives' counts are not kept while dynamo traces), and compute exactly what
    they compute eagerly; their --async-tp rings, eager ops between two compiled graphs, cast with compiled
    kernels and compute exactly what the rings with torchao's eager casts compute."""
    from .conftest import ROOT

    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(ROOT / "tests" / "workers" / "float8_graph_breaks.py")],
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    names = ("column", "row", "replicated", "gather", "reduce_scatter", "ring_gather", "ring_reduce_scatter")
    found = {words[0]: words[1:] for words in map(str.split, r.stdout.splitlines()) if words[:1] and words[0] in names}
    assert set(found) == set(names), r.stdout
    for name, (breaks, error) in found.items():  # a ring is an eager op: the one break, by design
        assert int(breaks) == name.startswith("ring_") and float(error) == 0.0, (name, breaks, error)
