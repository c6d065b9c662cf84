"""Sequence parallelism (Megatron's form) and parallel-residual blocks' one collective.

Under `Plan(sequence_parallel=True)` the norms, dropout and residual adds between a row-parallel
output and the next column-parallel input run on 1/tp of the sequence: the all-reduce of each
row-parallel sum becomes a reduce-scatter, the input of each column-parallel layer is all-gathered
(reduce-scattered backward), and the norms' weights are read whole by every rank with their
gradients summed over tp; each column-parallel linear keeps the tokens' shard for backward, not
the gathered input. (HF GPT-2's Conv1D row-parallel output is 2-D [b*s, h]: no sequence dim, so
SP keeps the all-reduce there, by design.) Parity against the untouched model runs in threads (the local backend);
the real gloo run (slow) checks the same on processes, where the reduce-scatter is gloo's.
"""

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.collectives import collectives, count_table
from graphsplit.analysis.memory import saved_bytes
from graphsplit.backends import threads
from graphsplit.ir.meta import info
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model
from graphsplit.ops import tp as tpops
from graphsplit.ops.tp_comm import TPComm
from graphsplit.rewrite import rewrite_loaded

from .conftest import EXAMPLES, MODELS
from .test_cli import cli

SP = Plan(tp=2, sequence_parallel=True)
SP_PP = Plan(tp=2, pp=2, sequence_parallel=True)
REPLICATED_GRAD_SUMS = 6  # per GPT block: ln_1, ln_2 (weight, bias) and the two row-parallel biases


def graphs(program) -> list[fx.Graph]:
    """Every graph of every stage, checkpoint regions' inner graphs included."""
    return [m.graph for st in program.stages for m in st.gm.modules() if isinstance(m, fx.GraphModule)]


def per_block(program) -> dict:
    return count_table(collectives(graphs(program)))["per_block"]


def uncast(node: fx.Node) -> fx.Node:
    """The value a cast (autocast's `x.to(dtype)`) reads."""
    return node.args[0] if node.op == "call_method" and node.target == "to" else node


def stage_activations(program) -> list[int]:
    """Bytes each stage keeps for backward (one micro-batch, one tp rank), as bench/memory.py measures."""
    found = []
    for st in program.stages:
        names = {id(st.gm.get_parameter(k)): c for k, c in st.param_sources.items()}
        found.append(saved_bytes(st.gm, st.input_examples(), program.plan.tp, True, program.param_shardings, names))
    return found


def test_plan_field_is_validated_and_round_trips(tmp_path):
    with pytest.raises(GraphsplitError, match=r"Plan.sequence_parallel: .*tp=1"):
        Plan(sequence_parallel=True)
    assert Plan.from_dict(SP.to_dict()) == SP
    (tmp_path / "plan.json").write_text(SP_PP.to_json())
    assert Plan.load(tmp_path / "plan.json").sequence_parallel
    r = cli("transform", EXAMPLES / "mlp.py", "--sequence-parallel", "--out", tmp_path / "out")
    assert r.returncode != 0 and "Plan.sequence_parallel" in r.stderr and "Traceback" not in r.stderr


def assert_megatron_sequence_parallel_count(program) -> None:
    """Forward: 2 all-gathers (into the column-parallel layers) and 2 reduce-scatters (out of the
    row-parallel ones) per block, no all-reduce; backward the mirror, plus the all-gathers of the
    kept shards for the column-parallel weights' gradients (Megatron's count) and the sums of the
    gradients of the replicated weights the tokens' shards read."""
    table = per_block(program)
    blocks = {k: v for k, v in table.items() if k.startswith("h.")}
    assert len(blocks) == 4
    for name, counts in blocks.items():
        assert counts["forward"] == {"all_gather": 2, "reduce_scatter": 2}, name
        assert counts["backward"] == {"all_gather": 4, "reduce_scatter": 2, "all_reduce": REPLICATED_GRAD_SUMS}, name
    assert table["wte"]["forward"] == {"reduce_scatter": 1}  # the embedding's sum left split on the sequence
    assert not any("ln_" in k for k in program.param_shardings)  # norms stay replicated
    assert "reduce_from_tp" not in program.stages[0].gm.code


def assert_the_saved_activations_drop(sp_program, loaded) -> None:
    """What one rank keeps for backward (measured on meta, as bench/memory.py) drops by the norms'
    and residuals' region: per block ln_1's and ln_2's inputs and outputs, and ln_f's input and
    output, each [b, s, h] kept as [b, s/tp, h] (the column-parallel linears keep the shard they
    gather, not the gathered tokens), with each norm's mean and rstd [b, s, 1]. The attention and
    MLP inside (already split by tp) keep what they kept."""
    (tp_alone,) = stage_activations(rewrite_loaded(loaded, Plan(tp=2)).program)
    (sp,) = stage_activations(sp_program)
    model = loaded.build("meta")
    (b, s), h, layers, tp = loaded.args[0].shape, model.cfg.n_embd, model.cfg.n_layer, 2
    tokens = b * s * h * 4  # fp32 [b, s, h]
    region = (4 * layers + 2) * tokens + (2 * layers + 1) * 2 * b * s * 4
    assert tp_alone - sp == region - region // tp


@pytest.mark.parametrize("spec, plan", [
    ("gpt.py", SP), ("gpt.py", SP_PP.replace(checkpoint="blocks")), ("llama.py", SP.replace(autocast="bf16")),
    ("llama.py", SP_PP.replace(checkpoint="selective")), ("hf_llama.py", SP),
], ids=["gpt-tp2", "gpt-tp2-pp2-blocks", "llama-tp2-bf16", "llama-tp2-pp2-selective", "hf_llama-tp2"])
def test_sequence_parallel_equals_the_untouched_model(spec, plan):
    """Loss, output, every rank's gradients (fp32; under bf16 loss and output within its tolerance),
    with recomputation (blocks, selective) running the gathering linears again."""
    path = EXAMPLES / spec if (EXAMPLES / spec).exists() else MODELS / spec
    loaded = load_model(str(path))
    program, cmp = check_locally(loaded, plan)
    assert cmp.ok, cmp.failures
    assert "loss" in cmp.max_diff
    if spec == "gpt.py" and plan.pp == 1:
        assert_megatron_sequence_parallel_count(program)
        assert_the_saved_activations_drop(program, loaded)
    nodes = [n for g in graphs(program) for n in g.nodes]
    fused = [n for n in nodes if n.target is tpops.column_linear_from_seq_shard]
    # every linear reading the gathered tokens keeps their shard instead: no gathered [b, s, h] is kept
    assert fused and not [n for n in nodes if n.target is F.linear and uncast(n.args[0]).target is tpops.gather_for_column]
    if plan.autocast:
        assert {info(n).tensor.dtype for n in fused} == {torch.bfloat16}
    found = count_table(collectives(graphs(program)))["total"]
    assert found["forward"].get("reduce_scatter") and "all_reduce" not in found["forward"]
    # one all-gather forward per gathered value (q, k, v share theirs), one backward per linear's weight
    gathers = [n for n in nodes if n.target is tpops.gather_for_column]
    assert found["forward"]["all_gather"] == len(gathers) <= len(fused) <= found["backward"]["all_gather"]
    for rank in range(2):  # every rank's gradients compared: sharded ones, and replicated norms' whole
        compared = {k.removeprefix("grad ").removesuffix(f" (rank {rank})") for k in cmp.max_diff if k.endswith(f"(rank {rank})")}
        assert compared & set(program.param_shardings)
        assert any("norm" in k or "ln" in k for k in compared - set(program.param_shardings))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp64", "autocast-bf16"])
def test_column_linear_from_seq_shard_equals_gathering_then_linear(autocast):
    """Threads at tp 2: output, input / weight / bias gradients of `F.linear(gather_for_column(x))`
    (each rank's columns, its tokens' rows); the shard is gathered once forward and once backward,
    the input gradient reduce-scattered once. Under torch.autocast the product runs in bf16 as
    F.linear's would, and each gradient comes back in its input's dtype."""
    dtype = torch.float32 if autocast else torch.float64
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g, dtype=dtype) for shape in ((2, 4, 6), (8, 6), (8,)))
    upstream = torch.randn(2, 4, 8, generator=g, dtype=dtype)
    hub = threads.ThreadHub(2)

    def work(rank, fused):
        comm = TPComm(2)
        comm.bind(threads.ThreadLink(hub, rank))
        xs, ws, bs = (t.chunk(2, dim)[rank].clone().requires_grad_(True) for t, dim in ((x, 1), (w, 0), (b, 0)))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            gathered = tpops.gather_for_column(xs, 1, comm)
            out = tpops.column_linear_from_seq_shard(gathered, xs, ws, bs, 1, comm) if fused else F.linear(gathered, ws, bs)
        (out.float() * upstream.chunk(2, -1)[rank]).sum().backward()
        return out.detach(), xs.grad, ws.grad, bs.grad, dict(comm.counts)

    want = threads.run_ranks(hub, lambda r: work(r, False))
    got = threads.run_ranks(hub, lambda r: work(r, True))
    for rank in range(2):
        for a, e in zip(got[rank][:4], want[rank][:4]):
            assert a.dtype == e.dtype
            torch.testing.assert_close(a, e, **({"atol": 1e-2, "rtol": 1e-2} if autocast else {}))
        assert got[rank][1].dtype == dtype and got[rank][0].dtype == (torch.bfloat16 if autocast else dtype)
        assert got[rank][4] == {("forward", "all_gather"): 1, ("backward", "reduce_scatter"): 1,
                                ("backward", "all_gather"): 1}


def test_a_sequence_tp_does_not_divide_is_refused():
    loaded = load_model(str(MODELS / "parallel_residual.py"))
    loaded.args = (torch.randint(0, 64, (2, 7)),)
    loaded.target = torch.randint(0, 64, (2, 7))
    with pytest.raises(GraphsplitError, match=r"sequence parallelism splits the sequence dim .*size 7.* multiple of 2"):
        rewrite_loaded(loaded, SP)


@pytest.mark.parametrize("plan, forward, backward", [
    (Plan(tp=2), {"all_reduce": 1}, {"all_reduce": 1}),
    # backward: each of the 4 column-parallel linears (q, k, v, fc) all-gathers the kept shard again
    (SP, {"all_gather": 1, "reduce_scatter": 1}, {"all_gather": 1 + 4, "reduce_scatter": 1, "all_reduce": 3}),
], ids=["tp2", "tp2-sp"])
def test_parallel_residual_sums_before_one_collective(plan, forward, backward):
    """`x + attn(ln(x)) + mlp(ln(x))`: the two row-parallel partial sums are added first, one
    collective forward; the shared norm's output feeds both column-parallel layers through one f."""
    program, cmp = check_locally(load_model(str(MODELS / "parallel_residual.py")), plan)
    assert cmp.ok, cmp.failures
    table = per_block(program)
    for name in ("blocks.0", "blocks.1"):
        assert table[name] == {"forward": forward, "backward": backward}, name


def test_hf_gpt_neox_parallel_residual_one_forward_all_reduce():
    """HF's GPT-NeoX (use_parallel_residual, a norm per branch) equals the untouched model with
    1 all-reduce forward per block (against Megatron's 2); backward keeps one per norm, each
    branch's f."""
    program, cmp = check_locally(load_model(str(MODELS / "hf_gpt_neox.py")), Plan(tp=2))
    assert cmp.ok, cmp.failures
    layers = {k: v for k, v in per_block(program).items() if k.startswith("gpt_neox.layers.")}
    assert len(layers) == 2
    for name, counts in layers.items():
        assert counts == {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 2}}, name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_sequence_parallel_parallel_residual():
    """Real gloo ranks: gloo's reduce-scatters and all-gathers of the sequence across processes;
    step 1's gradients and every step's loss match (pipeline cuts carrying the tokens' shards run
    in the local backend above)."""
    lines: list[str] = []
    cmp = run_training(str(MODELS / "parallel_residual.py"), SP, RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("rank" in k for k in cmp.max_diff)


def test_the_summary_shows_the_sequence_sharded_regions_and_the_collective_volume():
    """Message sizes from the shapes (b x s x h fp32 tokens): sequence parallelism reduce-scatters what
    tp all-reduces and all-gathers each column input, the same sizes as Megatron's; the regions on the
    tokens' shard are every block and the final norm."""
    from graphsplit.report.summary import summarize

    loaded = load_model(str(EXAMPLES / "gpt.py"))
    b, s = loaded.args[0].shape
    h, layers = loaded.build("meta").wte.embedding_dim, 4
    tokens, positions, ce = b * s * h * 4, s * h * 4, 3 * b * s * 4
    tp = summarize(rewrite_loaded(loaded, Plan(tp=2)).program)
    assert tp["collective_bytes"]["forward"] == {"all_reduce": (2 * layers + 1) * tokens + positions + ce}
    assert "sequence_sharded" not in tp
    sp = summarize(rewrite_loaded(loaded, Plan(tp=2, sequence_parallel=True)).program)
    forward = sp["collective_bytes"]["forward"]
    assert forward["reduce_scatter"] == (2 * layers + 1) * tokens + positions  # row outputs, embeddings
    assert forward["all_gather"] == (2 * layers + 1) * tokens  # into qkv, fc and the LM head
    assert {f"h.{i}" for i in range(layers)} | {"ln_f"} <= set(sp["sequence_sharded"])
