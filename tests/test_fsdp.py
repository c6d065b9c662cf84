"""--fsdp: FSDP2 `fully_shard` over the dp axis (ZeRO-3), under pipeline and tensor parallelism."""

import contextlib
import datetime
from collections.abc import Iterator

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from graphsplit import GraphsplitError, Plan
from graphsplit.cli import main
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.runtime.dcp import safe_read
from graphsplit.runtime.dcp.state import export_weights

from .conftest import EXAMPLES


def test_fsdp_needs_data_parallel_replicas():
    done = CliRunner().invoke(main, ["transform", str(EXAMPLES / "mlp.py"), "--pp", "2", "--fsdp"])
    assert done.exit_code == 2
    assert "--fsdp shards parameters over the data-parallel replicas but dp=1; give --dp 2 or more" in done.output


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_fsdp_with_tensor_parallel_matches_the_untouched_model_and_its_checkpoint_loads_without_fsdp(tmp_path):
    """FSDP over dp x tp (2D, 4 processes), each checkpointed block an FSDP unit of its own (gathered
    for its forward, freed, gathered again for its recompute and backward), trains like the untouched
    model; its dp-sharded blocks, AdamW state included, load into ranks that do not shard over dp. FSDP
    under a pipeline too (3D, 8 processes) is tests/test_parallelize.py's dp2 x pp2 x tp2 run."""
    lines: list[str] = []
    opts = RunOptions(steps=3, optimizer="adamw", check=True, timeout_s=240, save=str(tmp_path / "fsdp"))
    plan = Plan(dp=2, tp=2, fsdp=True, checkpoint="blocks")
    assert plan.fsdp_per_region and not plan.replace(pp=2, schedule="zbv", stages_per_rank=2).fsdp_per_region
    cmp = run_training(str(EXAMPLES / "llama.py"), plan, opts, echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("loss curve    3 steps" in line for line in lines)
    # each rank ran the model's constructor keeping only its own parameters (runtime/exact_init.py)
    assert any("keeping only its own parameters" in line for line in lines)

    run_training(str(EXAMPLES / "llama.py"), Plan(tp=2), RunOptions(steps=0, optimizer="adamw", timeout_s=300,
                 resume=str(tmp_path / "fsdp"), save=str(tmp_path / "plain")), echo=lines.append)
    export_weights(tmp_path / "fsdp", tmp_path / "a.safetensors")
    export_weights(tmp_path / "plain", tmp_path / "b.safetensors")
    a, b = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    stored = safe_read.stored_keys(tmp_path / "plain" / "step-3")
    assert "optimizer/layers.0.attention.wq.weight/exp_avg_sq" in stored


def test_fsdp_under_bf16_gathers_parameters_in_bf16_and_keeps_fp32_master_weights(tmp_path):
    """apply_fsdp's MixedPrecisionPolicy: the gathered parameters a forward reads are bf16, the
    sharded ones the optimizer steps stay fp32, gradients arrive in fp32."""
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh

    from graphsplit.backends.parallelize import apply_fsdp

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=__import__("datetime").timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        seen = []
        model[0].register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.dtype))
        apply_fsdp([model], mesh, "bf16")
        # inputs are not cast by FSDP (cast_forward_inputs=False): graphsplit's program casts them itself
        model(torch.randn(4, 8).bfloat16()).float().sum().backward()
        assert seen == [torch.bfloat16]
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_fsdp_under_bf16_keeps_the_programs_dtypes():
    """Under --fsdp --autocast bf16 every parameter read outside a matmul (an embedding's rows, a norm's
    weight) is read through an fp32 copy: what crosses a stage boundary does not depend on the
    dtype FSDP gathers in."""
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded

    program = rewrite_loaded(load_model(str(EXAMPLES / "llama.py")), Plan(dp=2, pp=2, fsdp=True, autocast="bf16")).program
    code = program.stages[0].gm.code
    assert "tok_embeddings_weight.to(torch.float32)" in code
    assert "layers_0_attention_norm_weight.to(torch.float32)" in code
    plain = rewrite_loaded(load_model(str(EXAMPLES / "llama.py")), Plan(dp=2, pp=2, autocast="bf16")).program
    assert "tok_embeddings_weight.to(torch.float32)" not in plain.stages[0].gm.code  # DDP: fp32 parameters


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_feature_of_the_planners_405b_plan_together_matches_the_untouched_model():
    """What `graphsplit plan` picks for Llama 3 405B (bench/planner.py): tp with sequence parallelism,
    interleaved 1F1B, FSDP gathering in bf16, the first block of each stage recomputed (first:1: with
    the example's 4 blocks on 4 stages, each stage's one block; tests/test_checkpoint.py has stages of
    two), torch.compile, together on 8 processes (the stage inputs FSDP must not cast: fp32 residuals
    between interleaved stages)."""
    lines: list[str] = []
    plan = Plan(tp=2, sequence_parallel=True, pp=2, schedule="interleaved-1f1b", stages_per_rank=2, dp=2, fsdp=True,
                autocast="bf16", checkpoint="first:1", microbatches=2, compile=True)
    cmp = run_training(str(EXAMPLES / "llama.py"), plan, RunOptions(steps=1, check=True, timeout_s=300),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)


@contextlib.contextmanager
def one_rank_fsdp_stage(plan: Plan, tmp_path) -> Iterator[tuple]:
    """The Llama example's one stage under `plan`, materialized and wrapped by `apply_fsdp` on a world of one
    gloo rank: (loaded model, program, stage module, its units' regions)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from graphsplit.backends.parallelize import apply_fsdp
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded
    from graphsplit.runtime.materialize import materialize_stage, model_tensors

    loaded = load_model(str(EXAMPLES / "llama.py"))
    program = rewrite_loaded(loaded, plan).program
    (stage,) = program.stages
    module = materialize_stage(stage, "cpu", model_tensors(loaded.build("cpu")))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        apply_fsdp([module], mesh, units=[program.fsdp_units(0)], reshard_after_forward=plan.fsdp_reshards)
        yield loaded, program, module, [module.get_submodule(name) for name in program.fsdp_units(0)]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("zero", [2, 3])
def test_zero2_keeps_each_units_parameters_gathered_from_its_forward_to_its_backward(zero, tmp_path):
    """One stage, no pipeline: ZeRO-3 frees a block's gathered parameters after its forward (gathered
    again for its backward), ZeRO-2 keeps them to the end of the backward; the program's units as
    `apply_fsdp` makes them, a forward run on one rank."""
    from torch.distributed.tensor import DTensor

    plan = Plan(dp=2, fsdp=True, zero=zero)
    assert plan.fsdp_reshards == (zero == 3)
    with one_rank_fsdp_stage(plan, tmp_path) as (loaded, program, module, regions):
        assert len(regions) == 4  # a unit per block
        out = module(*program.traced.flatten_inputs(loaded.args, loaded.kwargs))
        gathered = [not any(isinstance(p, DTensor) for p in r.parameters()) for r in regions]
        assert gathered == [zero == 2] * 4  # after the forward: held whole (ZeRO-2) or freed (ZeRO-3)
        sum(o.float().sum() for o in out if isinstance(o, torch.Tensor) and o.is_floating_point()).backward()
        assert all(isinstance(p, DTensor) for r in regions for p in r.parameters())  # both free them after backward


@pytest.mark.parametrize("zero, gathers", [(3, 2), (2, 1)])
def test_over_two_micro_batches_zero2_gathers_once_a_step_and_zero3_every_micro_batch(zero, gathers, tmp_path):
    """One stage, two micro-batches through the program's own step (LocalPipeline): before each block's
    forward its parameters are sharded (FSDP must gather them) in every micro-batch under ZeRO-3, in the
    first only under ZeRO-2, whose units stay gathered to the last backward; both end the step sharded.
    What the planner prices (planner/dp_traffic.py) follows from these counts."""
    from torch.distributed.tensor import DTensor

    from graphsplit.backends.local import LocalPipeline
    from graphsplit.runtime.training import make_loss

    with one_rank_fsdp_stage(Plan(dp=2, fsdp=True, zero=zero, microbatches=2), tmp_path) as (
            loaded, program, module, regions):
        sharded_at_forward: list[bool] = []
        for region in regions:  # prepended: runs before FSDP's own pre-forward hook gathers the unit
            region.register_forward_pre_hook(
                lambda mod, args: sharded_at_forward.append(any(isinstance(p, DTensor) for p in mod.parameters())),
                prepend=True)
        pipeline = LocalPipeline(program, [module], make_loss(program, loaded.loss_fn))
        pipeline.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
        assert len(sharded_at_forward) == 2 * len(regions)
        assert sum(sharded_at_forward) == gathers * len(regions), sharded_at_forward
        assert all(isinstance(p, DTensor) for p in module.parameters())  # the step ends sharded for the optimizer


@pytest.mark.parametrize("args, message", [
    (["--dp", "2", "--zero", "1", "--fsdp"], "ZeRO-1 keeps parameters and gradients whole"),
    (["--zero", "1"], "dp=1; give --dp 2 or more"),
    (["--zero", "4"], "not in the range"),
])
def test_a_zero_stage_that_cannot_work_is_refused_in_one_line(args, message):
    done = CliRunner().invoke(main, ["transform", str(EXAMPLES / "gpt.py"), *args])
    assert done.exit_code == 2 and message in done.output and len(done.output.strip().splitlines()) == 1, done.output
    with pytest.raises(GraphsplitError, match="set fsdp=True"):
        Plan(dp=2, zero=2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_zero_1_and_2_match_the_untouched_model_and_their_checkpoints_reshard_between_stages(tmp_path):
    """ZeRO-1 (DDP, each replica stepping its share of AdamW's states) and ZeRO-2 (FSDP2, over two
    micro-batches) on 2 processes train like the untouched model (run --check); ZeRO-1's checkpoint, each replica writing the states
    it holds, resumes under ZeRO-2, whose own resumes under ZeRO-3: the same weights and AdamW states."""
    from graphsplit.runtime.dcp import safe_read

    lines: list[str] = []
    zero1 = str(tmp_path / "zero1")
    cmp = run_training(str(EXAMPLES / "llama.py"), Plan(dp=2, zero=1), RunOptions(
        steps=2, optimizer="adamw", check=True, timeout_s=240, save=zero1), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    stored = safe_read.stored_keys(tmp_path / "zero1" / "step-2")
    assert "optimizer/layers.0.attention.wq.weight/exp_avg_sq" in stored and "optimizer/output.weight/exp_avg" in stored
    zero2 = str(tmp_path / "zero2")
    # two micro-batches: ZeRO-2's units stay gathered from the first forward to the last backward
    cmp = run_training(str(EXAMPLES / "llama.py"), Plan(dp=2, fsdp=True, zero=2, microbatches=2), RunOptions(
        steps=1, optimizer="adamw", check=True, timeout_s=240, resume=zero1, save=zero2), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    run_training(str(EXAMPLES / "llama.py"), Plan(dp=2, fsdp=True), RunOptions(
        steps=0, optimizer="adamw", timeout_s=240, resume=zero2, save=str(tmp_path / "zero3")), echo=lines.append)
    export_weights(tmp_path / "zero2", tmp_path / "a.safetensors")
    export_weights(tmp_path / "zero3", tmp_path / "b.safetensors")
    a, b = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
