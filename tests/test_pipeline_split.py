"""The pipeline_split pass and the Program it leads to, without processes."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.balance import _Ends, balanced_cuts
from graphsplit.analysis.shapes import annotate
from graphsplit.ir.meta import info
from graphsplit.ir.op_kinds import OpKind
from graphsplit.ir.trace import trace_model
from graphsplit.loader import load_model
from graphsplit.passes.pipeline_split import liveness
from graphsplit.rewrite import rewrite_loaded


def program_for(path, **plan):
    loaded = load_model(str(path))
    return rewrite_loaded(loaded, Plan(**plan)).program


def test_every_boundary_carries_only_tensors_and_stages_cover_the_graph(examples_dir):
    program = program_for(examples_dir / "gpt.py", pp=4)
    assert len(program.stages) == 4 and len(program.boundaries) == 3
    for b in program.boundaries:
        assert b.values and all(spec is not None for spec in b.specs)
    for st in program.stages:
        # placeholders of a stage are exactly the values it receives: no ints, no shapes
        phs = [n for n in st.gm.graph.nodes if n.op == "placeholder"]
        assert [p.name for p in phs] == st.inputs
        assert all(info(p).value == "tensor" for p in phs)
        st.gm.graph.lint()
    assert program.stages[0].inputs == ["idx"]


def test_tied_embedding_and_lm_head_live_on_first_and_last_stage(examples_dir):
    program = program_for(examples_dir / "gpt.py", pp=4)
    (name, stages), = program.shared_params.items()
    assert name in ("wte.weight", "lm_head.weight")
    assert stages == [0, 3]


def test_input_read_only_by_last_stage_is_passed_through_every_stage(models_dir):
    program = program_for(models_dir / "last_input.py", pp=4)
    assert program.stages[0].inputs == ["x", "scale"]
    for b in program.boundaries:
        assert "scale" in b.values
    assert "scale" in program.stages[3].inputs
    assert program.shared_params == {"shared": [0, 3]}


def test_unet_skip_connection_crosses_several_stages(examples_dir):
    program = program_for(examples_dir / "unet.py", pp=4)
    crossing = [set(b.values) for b in program.boundaries]
    long_skips = set.intersection(*crossing)
    assert long_skips, "the first encoder level's output should cross all three boundaries"
    (skip,) = long_skips
    assert skip in program.stages[0].outputs and skip in program.stages[3].inputs


def test_scalars_are_recomputed_not_sent(examples_dir):
    # GPT's views need the batch size; later stages recompute it from a tensor they hold.
    program = program_for(examples_dir / "gpt.py", pp=2)
    later = program.stages[1].gm.graph
    shape_nodes = [n for n in later.nodes if info(n).kind == OpKind.SHAPE]
    assert shape_nodes, "stage 1 should recompute sizes locally"
    assert all(info(n).value == "tensor" for n in later.nodes if n.op == "placeholder")


def test_a_stage_holds_no_weight_it_only_casts_for_a_later_stage(examples_dir):
    """Under bf16 autocast a weight's cast sits just before its matmul; a cut between them leaves the
    cast in the earlier stage while the later one makes it again for itself (recomputed, never sent):
    the earlier stage computes nothing unused, so it does not hold the weight (nor its gradient and
    optimizer state). Every tensor a stage computes is read there or sent."""
    loaded = load_model(str(examples_dir / "gpt.py"))
    for plan in (Plan(pp=2, autocast="bf16"), Plan(pp=3, tp=2, autocast="bf16", sequence_parallel=True)):
        program = rewrite_loaded(loaded, plan).program
        for st in program.stages:
            dead = [n.name for n in st.gm.graph.nodes if n.op in ("call_function", "call_method")
                    and not n.users and info(n).value == "tensor"]
            assert not dead, (plan, st.index, dead)
        held = [name for st in program.stages for name in set(st.param_sources.values())]
        shared = {name for name, stages in program.param_stages.items() if len(stages) > 1}
        assert shared <= {"wte.weight"} and len(held) == len(set(held)) + len(shared), (plan, shared)


def test_explicit_split_points_override(examples_dir):
    program = program_for(examples_dir / "mlp.py", pp=3, microbatches=4, split_at=("layers.2", "layers.6"))
    assert program.stages[1].modules[0] == "layers.2"
    assert program.stages[2].modules[0] == "layers.6"
    assert "layers.2" not in program.stages[0].modules


def test_split_point_naming_no_module_is_an_error(examples_dir):
    with pytest.raises(GraphsplitError, match=r"split point 'layers\.99' names no module.*layers"):
        program_for(examples_dir / "mlp.py", pp=2, split_at=("layers.99",))


def test_more_stages_than_cuts_is_an_error(models_dir):
    with pytest.raises(GraphsplitError, match=r"8 pipeline stages need 7 cuts.*use --pp"):
        program_for(models_dir / "tiny.py", pp=8, microbatches=1)


def test_non_tensor_output_is_an_error(models_dir):
    with pytest.raises(GraphsplitError, match=r"output #1 .* not a tensor"):
        program_for(models_dir / "int_output.py", pp=2)


def test_cuts_never_separate_a_tuple_from_its_getitems():
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 24)
            self.b = nn.Linear(8, 8)

        def forward(self, x):
            q, k, v = self.a(x).split(8, dim=-1)
            return self.b(q * k + v)

    x = torch.randn(4, 8)
    t = trace_model(Split(), (x,), {})
    annotate(t.gm, (x,))
    seq, _, blocked = liveness(t.gm)
    split_pos = next(i for i, n in enumerate(seq) if n.target == "split")
    last_getitem = max(i for i, n in enumerate(seq) if info(n).kind == OpKind.GETITEM)
    assert all(blocked[k] for k in range(split_pos + 1, last_getitem + 1))
    assert not blocked[split_pos] and not blocked[last_getitem + 1]


def test_balanced_cuts_is_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, stages = int(rng.integers(5, 11)), int(rng.integers(2, 5))
        costs = rng.uniform(0, 10, n)
        comm = rng.uniform(0, 2, n + 1)
        valid = np.ones(n + 1, dtype=bool)
        valid[rng.integers(1, n, 2)] = False
        cand = [k for k in range(1, n) if valid[k]]
        if len(cand) < stages - 1:
            continue

        def worst(cuts, n=n, costs=costs, comm=comm, stages=stages):
            b = [0, *cuts, n]
            return max(costs[b[i]:b[i + 1]].sum() + (comm[b[i + 1]] if b[i + 1] < n else 0) for i in range(stages))

        best = min(worst(c) for c in itertools.combinations(cand, stages - 1))
        got = balanced_cuts(costs, comm, valid, stages)
        assert len(got) == stages - 1 and all(valid[k] for k in got)
        assert worst(got) == pytest.approx(best)


def _stage_costs(costs: np.ndarray, comm: np.ndarray, cuts: list[int]) -> list[float]:
    b = [0, *cuts, len(costs)]
    return [float(costs[b[i]:b[i + 1]].sum() + (comm[b[i + 1]] if b[i + 1] < len(costs) else 0.0))
            for i in range(len(b) - 1)]


def test_the_slack_below_the_bottleneck_is_shared_out_not_left_to_the_last_stages():
    """Twenty light ops and a heavy one over 4 stages: the heavy op alone sets the bottleneck (9); packing
    each stage to it (the greedy) leaves the third stage 2 where the cut gives the first three about 7
    each. With 4 stages a rank over 2 ranks (stages 0 and 2 on rank 0), the greedy's ranks sum to 11
    and 18, the cut's to about 13 and 16."""
    costs = np.array([1.0] * 20 + [9.0])
    comm = np.zeros(22)
    valid = np.ones(22, dtype=bool)
    greedy = _Ends(costs, comm, valid).greedy(4, 9.0)
    assert _stage_costs(costs, comm, greedy) == [9, 9, 2, 9]
    got = _stage_costs(costs, comm, balanced_cuts(costs, comm, valid, 4))
    assert max(got) == 9 and max(got[:3]) - min(got[:3]) <= 1
    by_rank = [got[0] + got[2], got[1] + got[3]]
    assert max(by_rank) < 18


def test_within_the_slack_a_cut_moves_to_where_it_sends_less():
    """A heavy first op sets the bottleneck; the twelve light ops after it share two stages, evenly at
    six each, but ending there sends 5 and one op earlier nothing: the cut takes the earlier end."""
    costs = np.array([20.0] + [1.0] * 12)
    comm = np.zeros(14)
    comm[7] = 5.0
    valid = np.ones(14, dtype=bool)
    cuts = balanced_cuts(costs, comm, valid, 3)
    assert cuts == [1, 6] and max(_stage_costs(costs, comm, cuts)) == 20
    comm[7] = 0.0
    assert balanced_cuts(costs, comm, valid, 3) == [1, 7]


def test_many_stage_feasibility_in_numpy_equals_the_stage_by_stage_greedy():
    """The planner prices thousands of stages with the numpy form (doubling over every start at once);
    it decides exactly what the Python greedy decides, also where stages outnumber the easy ends."""
    rng = np.random.default_rng(1)
    for trial in range(300):
        n = int(rng.integers(3, 60))
        costs = rng.uniform(0, 10, n) * (rng.random(n) < 0.9)  # some ops cost nothing
        comm = rng.uniform(0, 3, n + 1)
        valid = rng.random(n + 1) < 0.8
        ends = _Ends(costs, comm, valid)
        count = len(ends.ends)
        if count < 2:
            continue
        stages = int(rng.integers(2, count + 1))
        for limit in np.concatenate([rng.uniform(0, ends.total + 3, 6), [ends.total + ends.max_cut]]):
            assert ends.reachable(stages, float(limit)) == (ends.greedy(stages, float(limit)) is not None), trial


def test_balance_ratio_is_max_over_mean_of_stage_costs(examples_dir):
    program = program_for(examples_dir / "gpt.py", pp=2)
    costs = [s.cost for s in program.stages]
    assert program.balance() == pytest.approx(max(costs) / (sum(costs) / len(costs)))
    assert program.balance() < 1.05


def test_saved_split_reproduces_the_same_stages(examples_dir):
    first = program_for(examples_dir / "resnet.py", pp=4)
    loaded = load_model(str(examples_dir / "resnet.py"))
    starts = tuple(s.first_node for s in first.stages[1:])
    again = rewrite_loaded(loaded, Plan(pp=4), starts).program
    assert [s.inputs for s in again.stages] == [s.inputs for s in first.stages]
    assert [s.modules for s in again.stages] == [s.modules for s in first.stages]


class _DecomposeThenProject(nn.Module):
    """Time-Series-Library's DLinear: a moving-average decomposition (pooling, padding, no parameters)
    costlier than the two linears after it, which a split by cost alone leaves with the last stage."""

    def __init__(self):
        super().__init__()
        self.seasonal = nn.Linear(32, 8)
        self.trend = nn.Linear(32, 8)

    def forward(self, x):  # [batch, channels, time]
        trend = x
        for _ in range(6):
            padded = torch.cat([trend[..., :1].repeat(1, 1, 2), trend, trend[..., -1:].repeat(1, 1, 2)], dim=-1)
            trend = nn.functional.avg_pool1d(padded, kernel_size=5, stride=1)
        return self.seasonal(x - trend) + self.trend(trend)


def test_the_first_and_last_stage_each_hold_a_layer():
    from graphsplit.rewrite import rewrite_program

    program = rewrite_program(_DecomposeThenProject(), (torch.randn(4, 3, 32),), {}, Plan(pp=2)).program
    held = [sorted({p for p in s.param_sources.values()}) for s in program.stages]
    assert all(held), held  # a rank with no parameters has nothing to train (run refuses it)


def test_a_send_weight_from_the_hardware_cuts_where_little_is_live_and_the_planner_prices_that_cut(examples_dir):
    """Llama at tp 2 with sequence parallelism over 2 stages: with the cost model's 8 FLOPs a byte the balanced
    cut falls inside a block, beside the gathered input of a column linear (the token shard and its gathered
    copy both cross); weighted as an H100 weighs a byte sent over NVLink it falls where only the residual's
    shard (and the token ids the next stage reads shapes from) cross. The planner, given the same weight,
    prices exactly the program's sends."""
    from graphsplit.planner import load_hardware, profile_model
    from graphsplit.planner.links import send_flops_per_byte
    from graphsplit.planner.stages import plan_stages

    loaded = load_model(str(examples_dir / "llama.py"))
    hw = load_hardware("h100")
    weight = send_flops_per_byte(hw, 2, low_precision=False)
    assert weight > 100
    default, weighted = (Plan(pp=2, tp=2, sequence_parallel=True, microbatches=2, send_flops_per_byte=w)
                         for w in (None, weight))
    crossing = {}
    for plan in (default, weighted):
        (boundary,) = rewrite_loaded(loaded, plan).program.boundaries
        crossing[plan.send_flops_per_byte] = boundary
        profile = profile_model(loaded, (2,), hw.fused_attention)
        profile.hardware = hw
        assert int(plan_stages(profile, plan).send_bytes[0]) == boundary.nbytes
    floats = {w: [s for s in b.specs if s.dtype.is_floating_point] for w, b in crossing.items()}
    assert len(floats[None]) > 1 and any(s.shape[1] == 32 for s in floats[None])  # a gathered (whole-sequence) copy
    assert [tuple(s.shape) for s in floats[weight]] == [(4, 16, 64)]  # the residual's shard alone
    assert crossing[weight].nbytes < crossing[None].nbytes


def test_the_search_weighs_sends_as_its_hardware_does():
    from collections import Counter

    from graphsplit.planner import load_hardware
    from graphsplit.planner.links import group_link, send_flops_per_byte
    from graphsplit.planner.search import candidates

    hw = load_hardware("h100")
    send = lambda tp, low: send_flops_per_byte(hw, tp, low)  # noqa: E731
    plans = list(candidates(16, 8, 16, 8, True, Counter(), send=send))
    piped = [p for p in plans if p.num_stages > 1]
    assert piped and all(p.send_flops_per_byte is None for p in plans if p.num_stages == 1)
    for p in piped[:: max(1, len(piped) // 50)]:
        bandwidth, _ = group_link(hw, 2 * p.tp)
        rate = hw.flops("bfloat16" if p.autocast else "float32")
        assert p.send_flops_per_byte == pytest.approx(rate / bandwidth, rel=1e-2)
    # across nodes (tp 8: pp neighbours 8 apart) a byte weighs about nine times what it weighs over NVLink
    assert send(8, True) / send(1, True) == pytest.approx(9, rel=0.05)
