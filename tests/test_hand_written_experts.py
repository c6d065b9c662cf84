"""Expert parallelism for experts written by hand. A loop over an `nn.ModuleList` (passes/expert_loops.py):
each expert called on the rows it picked, as mistral-inference's reference MoE (unchanged, from the
outside zoo) and tests/models/expert_loop_moe.py (`nonzero`, `index_add_`, experts as nn.Sequential, a
shared expert) write it: the calls become one exchange (ops/ep.py's `ep_send`/`ep_return`), each
expert-parallel rank running E / ep of them, its slots holding the weights of the experts it holds
(`Program.on_ep_rank`). A stacked weight gathered per row (passes/expert_gathers.py,
tests/models/gathered_experts.py: `self.w1[ids]` through `torch.bmm`, a per-expert bias, an einsum): each
op reading a gather runs where its rows' experts are held. Against the untouched model on the whole
batch, on real processes."""

import operator

import pytest
import torch

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.ops.ep import ep_return, ep_send
from graphsplit.rewrite import rewrite_loaded

from .conftest import MODELS, traced_once

MISTRAL = MODELS / "outside" / "mistral_moe_tiny.py"
LOOP = MODELS / "expert_loop_moe.py"
GATHERED = MODELS / "gathered_experts.py"
ARGMAX = MODELS / "argmax_routed_experts.py"


def _compile(path, plan):
    loaded, traced = traced_once(path)
    return rewrite_loaded(loaded, plan, traced=traced.copy()).program


def test_each_loop_becomes_one_exchange_and_each_rank_runs_half_the_experts():
    program = _compile(MISTRAL, Plan(dp=2, ep=2, pp=2))
    assert [(layer.module, layer.experts) for layer in program.expert_layers] == [
        (f"layers.{i}.feed_forward.experts", 4) for i in (0, 1)]
    calls = [n.target for st in program.stages for n in st.gm.graph.nodes if n.op == "call_module"]
    assert {c.split("experts.")[1].split(".")[0] for c in calls if ".experts." in c} == {"0", "1"}, \
        "the graph runs two slots; experts 2 and 3 are no part of it"
    for st in program.stages:  # each layer's exchange whole in one stage
        targets = [n.target for n in st.gm.graph.nodes]
        assert targets.count(ep_send) == targets.count(ep_return)
    assert sum(n.target is ep_send for st in program.stages for n in st.gm.graph.nodes) == 2
    slot = "layers.0.feed_forward.experts.1.w2.weight"
    assert program.expert_slots[slot] == (slot, "layers.0.feed_forward.experts.3.w2.weight")
    second = program.on_ep_rank(1)
    held = {c for st in second.stages for c in st.param_sources.values()}
    assert "layers.0.feed_forward.experts.3.w2.weight" in held and slot not in held
    assert "layers.0.feed_forward.gate.weight" in held, "the router stays whole on every rank"
    assert second.is_expert("layers.0.feed_forward.experts.3.w2.weight")
    assert not second.is_expert("layers.0.feed_forward.gate.weight")
    assert program.on_ep_rank(0).stages[0].param_sources == program.stages[0].param_sources


def test_the_summary_says_the_exchange_is_sized_at_most():
    from graphsplit.report.summary import summarize

    layer = summarize(_compile(LOOP, Plan(dp=2, ep=2)))["experts"][0]
    assert layer["module"] == "blocks.0.moe.experts" and layer["at_most"]
    assert layer["ranks"] == [{"ep_rank": 0, "first": 0, "last": 1}, {"ep_rank": 1, "first": 2, "last": 3}]
    # each of the 4 pieces as large as all 12 tokens of a replica's micro-batch (2 sequences of 6), 16 wide,
    # fp32; half of it leaves the rank
    assert layer["all_to_all_bytes"] == {"dispatch": 4 * 12 * 16 * 4 // 2, "combine": 4 * 12 * 16 * 4 // 2}


def test_unbound_the_exchange_keeps_its_own_experts_and_sizes_the_others():
    from graphsplit.ops.ep import EPComm

    pieces = [torch.randn(n, 3) for n in (2, 0, 4, 1)]
    sent = ep_send(EPComm(2), 0, *pieces)
    assert len(sent) == 3 and sent[0] is pieces[0] and sent[1] is pieces[1]
    back = ep_return(EPComm(2), sent[2], tuple(pieces), (sent[0] * 2, sent[1] * 2))
    assert [tuple(b.shape) for b in back] == [(2, 3), (0, 3), (4, 3), (1, 3)]
    torch.testing.assert_close(back[0], pieces[0] * 2)


@pytest.mark.parametrize("factory, message", [
    ("build_in_place_model", r"setitem at expert_loop_moe.py:\d+ in forward writes in place what getitem at "
                             r"expert_loop_moe.py:\d+ in forward reads, between the calls of blocks.0.moe.experts"),
    ("build_mixing_model", r"blocks.0.moe.experts.0: blocks.0.moe.experts.0.1 \(BatchNorm1d\) at "
                           r"expert_loop_moe.py:\d+ in forward does not work row by row"),
])
def test_loops_that_cannot_be_exchanged_are_refused_in_one_line(factory, message):
    from graphsplit.loader import load_model

    with pytest.raises(GraphsplitError, match=message) as caught:
        rewrite_loaded(load_model(f"{LOOP}:{factory}"), Plan(dp=2, ep=2))
    assert "\n" not in str(caught.value) and str(caught.value).endswith("drop --ep")


def test_experts_inside_a_module_run_as_written_are_named():
    from graphsplit.loader import load_model

    with pytest.raises(GraphsplitError, match=r"blocks.0.moe runs as written \(neither tracer follows its forward\), "
                                              "so the experts in it cannot be placed; drop --ep"):
        rewrite_loaded(load_model(str(MODELS / "data_dependent_moe.py")), Plan(dp=2, ep=2))


def test_a_list_of_layers_run_one_after_another_is_no_loop_of_experts():
    from graphsplit.analysis.shapes import annotate
    from graphsplit.passes.expert_loops import expert_loops

    loaded, traced = traced_once(LOOP)
    gm = traced.copy().gm
    annotate(gm, traced.flatten_inputs(loaded.args, loaded.kwargs))
    loops, why = expert_loops(gm)
    assert [loop.module for loop in loops] == ["blocks.0.moe.experts", "blocks.1.moe.experts"]
    assert any(w.startswith("blocks's children run one after another") for w in why), why


def test_each_op_reading_a_per_row_gather_runs_where_its_rows_experts_are():
    from graphsplit.ops.ep import ep_route_rows, ep_unroute_rows

    program = _compile(GATHERED, Plan(dp=2, ep=2, pp=2))
    assert sorted(program.expert_params) == sorted(f"moes.{i}.{w}" for i in (0, 1) for w in ("w1", "b1", "w2"))
    assert set(program.expert_params.values()) == {0}  # held in slices of their expert dim
    assert [(layer.module, layer.experts) for layer in program.expert_layers] == [("moes.0", 4), ("moes.1", 4)]
    nodes = [n for st in program.stages for n in st.gm.graph.nodes]
    routes = [n for n in nodes if n.target is ep_route_rows]
    assert len(routes) == 6 == sum(n.target is ep_unroute_rows for n in nodes)  # bmm, + bias, einsum; 2 layers
    assert [n.args[3] for n in routes] == [0, -1, -1, 1, -1, -1], "each layer's rows counted once"
    # the ops that read a gather, each between its exchange and the way back
    assert [n.args[0].target for n in nodes if n.target is ep_unroute_rows] == [torch.bmm, operator.add, torch.einsum] * 2
    assert "moes.0.router.weight" not in program.expert_params
    from graphsplit.report.summary import summarize

    # every op's exchange counted to its layer: a replica's micro-batch of 6 tokens (2 sequences of 6, 2
    # micro-batches), fp32, half leaving the rank; in: bmm's [6, 1, 16], the bias add's [6, 24], the
    # einsum's [6, 24]; out: [6, 1, 24], [6, 24], [6, 16]
    layer = summarize(program)["experts"][0]
    assert layer["all_to_all_bytes"] == {"dispatch": 6 * (16 + 24 + 24) * 4 // 2, "combine": 6 * (24 + 24 + 16) * 4 // 2}


@pytest.mark.parametrize("factory, reader", [("build_whole_read_model", "pow"), ("build_first_read_model", "getitem")])
def test_a_stacked_weight_also_read_otherwise_is_refused_in_one_line(factory, reader):
    """Read whole (a penalty on it) or one expert's matrix by a constant index (`w1[0]`): a rank's slice
    would stand for the whole, or for another expert."""
    from graphsplit.loader import load_model

    with pytest.raises(GraphsplitError, match=rf"--ep: moes.0.w1 is gathered per row at gathered_experts.py:\d+ in "
                                              rf"forward and also read otherwise by {reader} at gathered_experts.py:\d+"):
        rewrite_loaded(load_model(f"{GATHERED}:{factory}"), Plan(dp=2, ep=2))


REAL = [
    (MISTRAL, Plan(dp=2, ep=2, tp=2)),  # each rank's two experts also column/row-parallel over tp
    (LOOP, Plan(dp=2, ep=2, pp=2)),
    (GATHERED, Plan(dp=2, ep=2, pp=2)),
    (ARGMAX, Plan(dp=2, ep=2)),  # experts read by get_attr; a router no gradient reaches (DDP waits for none)
]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("path, plan", REAL, ids=["mistral-ep2-tp2", "loop-ep2-pp2-save-resume", "gathered-ep2-pp2", "argmax-ep2"])
def test_a_loop_of_experts_on_real_processes_matches_the_untouched_model(path, plan, tmp_path):
    from graphsplit.launch.launcher import RunOptions, run_training

    save = path == LOOP
    lines: list[str] = []
    cmp = run_training(str(path), plan, RunOptions(steps=2, check=True, timeout_s=300,
                                                   save=str(tmp_path / "ck") if save else None), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    graded = {k for k in cmp.max_diff if k.startswith("grad")}
    if path == ARGMAX:
        assert any(k.startswith("grad experts.3.w (rank ") for k in graded), graded
    elif path == GATHERED:  # each ep rank's slice of the stacked weights, against that slice of the gradient
        assert {k for k in graded if k.startswith("grad moes.1.w2 (rank ")} == {f"grad moes.1.w2 (rank {r})" for r in (1, 3)}
    else:
        assert any(".experts.3." in k and "(rank " in k for k in graded), "experts 2 and 3 checked on their ranks"
    if save:  # each rank saved its experts under their own names: resumed without ep, every rank holds all
        lines = []
        cmp = run_training(str(path), Plan(pp=2), RunOptions(steps=1, check=True, timeout_s=300,
                                                             resume=str(tmp_path / "ck")), echo=lines.append)
        assert cmp is not None and cmp.ok, "\n".join(lines)


def test_the_planner_refuses_to_price_ep_it_cannot_see():
    """The planner prices grouped experts only: ep over experts written by hand is refused, not priced as
    plain dp (it would hide the expert memory it saves and the all-to-alls it costs)."""
    from graphsplit import price

    with pytest.raises(GraphsplitError, match=r"--ep 2: the planner prices grouped experts .* finds none in this "
                                              "model; .* price the plan without --ep"):
        price(str(GATHERED), Plan(dp=2, ep=2), compare=False)


def test_a_router_read_only_through_argmax_gets_no_gradient_and_no_rank_waits_for_one():
    program = _compile(ARGMAX, Plan(dp=2, ep=2))
    assert {"router.weight", "router.bias"} <= program.params_without_grad
    assert not any(name.startswith(("experts.", "head.", "embed.")) for name in program.params_without_grad)
