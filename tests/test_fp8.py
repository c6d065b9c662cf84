"""--fp8: the model's linears in float8, as torchao converts them (`convert_to_float8_training`), at any plan.

The reference is the untouched model converted by torchao itself on one process (its GEMMs emulated in
float32 on the float8 values, as graphsplit's are off a GPU): the same modules, the same recipe. Under tp
the shards' scales must agree with the one scale torchao takes over the whole tensor (passes/float8.py),
so a model whose linears see the data itself (tests/models/linear_pair.py) matches to float32 rounding, and a model whose
inputs carry float32 rounding from earlier row-parallel sums (the GPT example) matches within the spread
the untouched float8 model itself shows under one ulp of noise on its weights (rowwise scaling flips more
values near a rounding boundary than tensorwise).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch

from graphsplit import GraphsplitError, Plan
from graphsplit.backends.local import LocalProgram
from graphsplit.ir.sharding import shard_tensor
from graphsplit.launch.reference import reference_step
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.materialize import model_tensors
from graphsplit.runtime.training import default_loss

from .conftest import EXAMPLES, MODELS

torchao = pytest.importorskip("torchao.float8", reason="--fp8 needs torchao (a test extra)")


def _torchao_model(model: torch.nn.Module, program, recipe: str) -> torch.nn.Module:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    return convert_to_float8_training(copy.deepcopy(model), config=config,
                                      module_filter_fn=lambda m, fqn: fqn in program.fp8_modules)


def _reference(spec: str, plan: Plan, noise: float = 0.0):
    """(the loaded model file, its program under `plan`, torchao's model's step on the same micro-batches and
    replicas, and that model's own spread per gradient under `noise` relative noise on its weights)."""
    loaded = load_model(spec)
    model = loaded.build("cpu", seed=0)
    program = rewrite_loaded(loaded, plan).program
    assert program.fp8_modules
    loss_fn = loaded.loss_fn or default_loss
    pieces = plan.num_microbatches * plan.dp  # activation scales are each micro-batch's, as torchao's under DDP
    step = (loaded.args, loaded.kwargs, loaded.target, loss_fn, pieces, 1, program)
    ref = reference_step(_torchao_model(model, program, plan.fp8), *step)
    spread: dict[str, float] = {}
    if noise:
        torch.manual_seed(0)
        nudged = copy.deepcopy(model)
        with torch.no_grad():
            for p in nudged.parameters():
                p.mul_(1 + noise * torch.randn_like(p))
        twin = reference_step(_torchao_model(nudged, program, plan.fp8), *step)
        spread = {n: float((twin.grads[n] - g).norm() / g.norm()) for n, g in ref.grads.items()}
    return loaded, model, program, ref, spread


def _rank_errors(program, ref, ranks) -> dict[str, float]:
    """Each rank's gradient shard against the reference's, norm-relative; `ranks`: (tp rank, grads by name)."""
    errors: dict[str, float] = {}
    for tp_rank, grads in ranks:
        for name, grad in grads.items():
            expected = shard_tensor(ref.grads[name], program.param_sharding(name), tp_rank, program.plan.tp)
            errors[f"{name} (rank {tp_rank})"] = float((grad - expected).norm() / expected.norm())
    return errors


def _errors(spec: str, plan: Plan, noise: float = 0.0) -> tuple[float, dict[str, float], dict[str, float]]:
    """(loss error, each gradient's error on every rank, the reference's own spread), the program on the
    local backend against torchao's model."""
    loaded, model, program, ref, spread = _reference(spec, plan, noise)
    local = LocalProgram(program, model_tensors(model), loaded.loss_fn)
    steps = local.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    errors = _rank_errors(program, ref, [(s.tp_rank, s.grads) for s in steps])
    return abs(float(steps[0].loss) - float(ref.loss)) / abs(float(ref.loss)), errors, spread


def _within_spread(errors: dict[str, float], spread: dict[str, float]) -> None:
    for key, error in errors.items():
        name = key.rsplit(" (rank", 1)[0]
        assert error <= max(1e-5, 10 * spread[name]), (key, error, spread[name])


MLP = str(MODELS / "linear_pair.py")
GPT = str(EXAMPLES / "gpt.py")
PLANS = {"tp2": Plan(tp=2), "pp2-mb2": Plan(pp=2), "tp2-pp2-mb1": Plan(tp=2, pp=2, microbatches=1),
         "tp2-sp": Plan(tp=2, sequence_parallel=True)}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_fp8_linears_equal_torchao_where_inputs_are_exact(recipe, plan):
    """A column- and a row-parallel linear on the data itself: every scale equals torchao's, so the
    loss and every rank's gradient shard match to float32 rounding."""
    loss, errors, _ = _errors(MLP, dataclasses.replace(PLANS[plan], fp8=recipe))
    assert loss < 1e-6 and max(errors.values()) < 1e-5, errors


def test_shards_scaled_alone_would_be_wrong(monkeypatch):
    """The amax reductions over tp are what makes the shards agree: without them tp 2 is far off."""
    from graphsplit.ops import float8

    monkeypatch.setattr(float8, "_reduced", lambda *args: False)
    _, errors, _ = _errors(MLP, Plan(tp=2, fp8="tensorwise"))
    assert max(errors.values()) > 1e-3


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("sp", [False, True])
def test_fp8_gpt_at_tp2_pp2_within_torchaos_own_spread(recipe, sp):
    """The GPT example (fused qkv split per head, the tied LM head vocab-parallel) at tp 2 x pp 2: each
    gradient within 10x the spread one ulp of weight noise gives torchao's model, and at least 1e-5; with
    sequence parallelism too (its gathering linears float8, their input's scale the whole sequence's)."""
    plan = Plan(tp=2, pp=2, microbatches=1, fp8=recipe, sequence_parallel=sp)
    if sp:
        assert len(rewrite_loaded(load_model(GPT), plan).program.fp8_modules) == 17  # every linear, gathering or not
    loss, errors, spread = _errors(GPT, plan, noise=2.0 ** -24)
    assert loss < 1e-5
    _within_spread(errors, spread)


def test_fp8_is_float8():
    """The program is not the fp32 model: its gradients are torchao's float8 ones, far from fp32's."""
    loaded = load_model(GPT)
    model = loaded.build("cpu", seed=0)
    program = rewrite_loaded(loaded, Plan(tp=2, fp8="tensorwise")).program
    steps = LocalProgram(program, model_tensors(model), loaded.loss_fn).step(
        program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    fp32 = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn)
    name = "h.0.mlp.c_fc.weight"
    expected = shard_tensor(fp32.grads[name], program.param_sharding(name), 0, 2)
    assert float((steps[0].grads[name] - expected).norm() / expected.norm()) > 1e-2
    assert len(program.fp8_modules) == 17  # 4 blocks x 4 linears and the LM head
    from click.testing import CliRunner

    from graphsplit.cli import main

    shown = CliRunner().invoke(main, ["transform", GPT, "--tp", "2", "--fp8", "rowwise"])
    assert shown.exit_code == 0 and "fp8 (rowwise): 17 linears in float8: h.0.attn.c_attn" in shown.output


def test_fp8_plan_and_command_line_refuse_what_they_cannot_do(tmp_path):
    with pytest.raises(GraphsplitError, match="tensorwise or rowwise"):
        Plan(fp8="mxfp8")
    with pytest.raises(GraphsplitError, match="--autocast bf16"):
        Plan(fp8="tensorwise", autocast="fp16")
    from click.testing import CliRunner

    from graphsplit.cli import main

    r = CliRunner().invoke(main, ["run", GPT, "--pp", "2", "--fp8", "tensorwise", "--autocast", "bf16", "--check",
                                  "--steps", "1"])
    assert r.exit_code != 0 and "--check" in r.output and "--autocast" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_run_check_under_fp8_on_real_processes(tmp_path):
    """`run --fp8 rowwise --sequence-parallel --check` at tp 2 x pp 2 on 4 gloo processes: trained, and checked
    against torchao's float8 model on the program's micro-batches (activation scales are each piece's), within
    that model's own spread; the loss falls."""
    r = subprocess.run([sys.executable, "-m", "graphsplit", "run", GPT, "--tp", "2", "--pp", "2", "--fp8", "rowwise",
                        "--sequence-parallel", "--steps", "3", "--lr", "0.05", "--check"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "check passed" in r.stdout and "torchao's float8 model" in r.stdout
    assert "on the program's 2 micro-batches" in r.stdout
    losses = [float(x) for x in re.findall(r"^step\s+\d+\s+loss (\S+)", r.stdout, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0]


@pytest.mark.slow
def test_fp8_with_fsdp_and_tp_on_real_processes_equals_torchao(tmp_path):
    """dp 2 (FSDP2) x tp 2 on 4 processes through `parallelize()`: each rank's step-1 gradients (FSDP's shards
    gathered) within torchao's own spread of its model on the same two replicas' batches."""
    plan = Plan(dp=2, tp=2, fsdp=True, fp8="tensorwise")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                        str(EXAMPLES / "train_parallelize.py"), "--model", "gpt", "--dp", "2", "--pp", "1", "--tp", "2",
                        "--fsdp", "--fp8", "tensorwise", "--steps", "1", "--dump", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    _, _, program, ref, spread = _reference(GPT, plan, noise=2.0 ** -24)
    dumps = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(4)]
    errors = _rank_errors(program, ref, [(d["tp_rank"], d["grads"]) for d in dumps])
    assert errors and all(d["grads"] for d in dumps)
    _within_spread(errors, spread)


@pytest.mark.parametrize("reduced", [True, False])
def test_check_locally_under_fp8_holds_and_catches_unagreed_scales(monkeypatch, reduced):
    """The local backend's check (torchao's model, its one-ulp twin as the spread) passes the GPT example at
    tp 2 with tensorwise scales, and fails it when the shards scale by their own amax alone."""
    from graphsplit.launch.parity import check_locally
    from graphsplit.ops import float8

    if not reduced:
        monkeypatch.setattr(float8, "_reduced", lambda *args: False)
    _, cmp = check_locally(load_model(GPT), Plan(tp=2, fp8="tensorwise"))
    assert cmp.ok is reduced, cmp.failures[:3]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_compiled_float8_linear_is_one_graph(monkeypatch, recipe):
    """Under --compile a stage's float8 linears trace into its graph: torchao's configs are built before
    dynamo runs (`prime`, called by apply_compile), since building one is code dynamo cannot trace (a
    graph break at every cast: the compiled fp8 stage ran 2.1x slower than torchao's on an H200)."""
    import torch.fx as fx
    import torch.nn as nn

    from graphsplit.ops import float8

    graph = fx.Graph()
    x = graph.placeholder("x")
    out = graph.call_function(float8.float8_linear, (x, graph.get_attr("w"), None, None, recipe, "replicated"))
    graph.output(out)
    root = nn.Module()
    root.w = nn.Parameter(torch.randn(32, 64))
    gm = fx.GraphModule(root, graph)
    inp = torch.randn(16, 64, requires_grad=True)
    monkeypatch.setattr(float8, "_CONFIGS", {})
    torch._dynamo.reset()
    assert torch._dynamo.explain(gm)(inp).graph_break_count > 0  # configs built inside the traced code
    monkeypatch.setattr(float8, "_CONFIGS", {})
    float8.prime(gm)
    torch._dynamo.reset()
    assert torch._dynamo.explain(gm)(inp).graph_break_count == 0
    torch._dynamo.reset()
