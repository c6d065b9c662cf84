"""Sequence parallelism (Megatron's form) and parallel-residual blocks' one collective.

Under `Plan(sequence_parallel=True)` the norms, dropout and residual adds between a row-parallel
output and the next column-parallel input run on 1/tp of the sequence: the all-reduce of each
row-parallel sum becomes a reduce-scatter, the input of each column-parallel layer is all-gathered
(reduce-scattered backward), and the norms' weights are read whole by every rank with their
gradients summed over tp. Parity against the untouched model runs in threads (the local backend);
the real gloo run (slow) checks the same on processes, where the reduce-scatter is gloo's.
"""

import pytest
import torch

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.collectives import collectives, count_table
from graphsplit.compile import compile_loaded
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import EXAMPLES, MODELS
from .test_cli import cli

SP = Plan(tp=2, sequence_parallel=True)
SP_PP = Plan(tp=2, pp=2, sequence_parallel=True)
REPLICATED_GRAD_SUMS = 6  # per GPT block: ln_1, ln_2 (weight, bias) and the two row-parallel biases


def per_block(program) -> dict:
    return count_table(collectives(st.gm.graph for st in program.stages))["per_block"]


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
    row-parallel ones) per block, no all-reduce; backward the mirror, plus the sums of the
    gradients of the replicated weights the tokens' shards read."""
    table = per_block(program)
    blocks = {k: v for k, v in table.items() if k.startswith("h.")}
    assert len(blocks) == 4
    for name, counts in blocks.items():
        assert counts["forward"] == {"all_gather": 2, "reduce_scatter": 2}, name
        assert counts["backward"] == {"all_gather": 2, "reduce_scatter": 2, "all_reduce": REPLICATED_GRAD_SUMS}, name
    assert table["wte"]["forward"] == {"reduce_scatter": 1}  # the embedding's sum left split on the sequence
    assert not any("ln_" in k for k in program.param_shardings)  # norms stay replicated
    assert "reduce_from_tp" not in program.stages[0].gm.code


@pytest.mark.parametrize("spec, plan", [
    ("gpt.py", SP), ("gpt.py", SP_PP), ("llama.py", SP), ("llama.py", SP_PP),
    ("hf_llama.py", SP),
], ids=["gpt-tp2", "gpt-tp2-pp2", "llama-tp2", "llama-tp2-pp2", "hf_llama-tp2"])
def test_sequence_parallel_equals_the_untouched_model(spec, plan):
    path = EXAMPLES / spec if (EXAMPLES / spec).exists() else MODELS / spec
    program, cmp = check_locally(load_model(str(path)), plan)
    assert cmp.ok, cmp.failures
    assert "loss" in cmp.max_diff
    if spec == "gpt.py" and plan.pp == 1:
        assert_megatron_sequence_parallel_count(program)
    found = count_table(collectives(st.gm.graph for st in program.stages))["total"]
    assert found["forward"].get("reduce_scatter") and "all_reduce" not in found["forward"]
    for rank in range(2):  # every rank's gradients compared: sharded ones, and replicated norms' whole
        compared = {k.removeprefix("grad ").removesuffix(f" (rank {rank})") for k in cmp.max_diff if k.endswith(f"(rank {rank})")}
        assert compared & set(program.param_shardings)
        assert any("norm" in k or "ln" in k for k in compared - set(program.param_shardings))


def test_a_sequence_tp_does_not_divide_is_refused():
    loaded = load_model(str(MODELS / "parallel_residual.py"))
    loaded.args = (torch.randint(0, 64, (2, 7)),)
    loaded.target = torch.randint(0, 64, (2, 7))
    with pytest.raises(GraphsplitError, match=r"sequence parallelism splits the sequence dim .*size 7.* multiple of 2"):
        compile_loaded(loaded, SP)


@pytest.mark.parametrize("plan, forward, backward", [
    (Plan(tp=2), {"all_reduce": 1}, {"all_reduce": 1}),
    (SP, {"all_gather": 1, "reduce_scatter": 1}, {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 3}),
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
