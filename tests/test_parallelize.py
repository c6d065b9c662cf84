"""`parallelize()` from a user script under torchrun equals the untouched model."""

import os
import re
import subprocess
import sys

import pytest
import torch

from graphsplit import Plan
from graphsplit.compile import compile_loaded
from graphsplit.ir.sharding import shard_tensor
from graphsplit.launch.launcher import RunOptions, reference_train
from graphsplit.launch.parity import compare, missing_grads, reference_step
from graphsplit.loader import load_model
from graphsplit.runtime.dcp.state import export_weights

from .conftest import EXAMPLES

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp, pp, tp, fsdp", [(1, 2, 1, False), (1, 2, 2, False), (2, 2, 2, False), (2, 2, 2, True)])
def test_parallelize_in_a_torchrun_script(tmp_path, dp, pp, tp, fsdp):
    world = dp * pp * tp
    steps = 5
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
        str(EXAMPLES / "train_parallelize.py"), "--model", "gpt", "--dp", str(dp), "--pp", str(pp), "--tp", str(tp),
        "--steps", str(steps), "--dump", str(tmp_path), *(["--fsdp"] if fsdp else []),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 2 loss" in r.stdout

    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("cpu", seed=0)
    plan = Plan(dp=dp, pp=pp, tp=tp, fsdp=fsdp)
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, dp * plan.num_microbatches)
    program = compile_loaded(loaded, plan).program
    dumps = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for d in dumps:  # FSDP: each rank stores about 1/dp of its shards (dim 0 split, so not exactly)
        assert d["held"] <= (0.6 * d["whole"] if fsdp else d["whole"]) and d["held"] > 0.4 * d["whole"]
    losses = [d["loss"] for d in dumps if d["loss"] is not None]
    assert len(losses) == dp * tp  # every tp rank of every replica's last stage has the loss
    got = {}
    for d in dumps:
        def shard(name, full, r=d["tp_rank"]):
            return shard_tensor(full, program.param_sharding(name), r, tp)

        cmp = compare(None, None, d["grads"], ref, expected=shard)
        assert cmp.ok, cmp.failures
        got.update(d["grads"])
    assert not missing_grads(ref, set(got))
    assert compare(losses[0], None, {}, ref).ok

    # the AdamW loss curve of the untouched model, trained on the same micro-batches
    curve = torch.load(next(tmp_path.glob("losses*.pt")))
    fresh = loaded.build("cpu", seed=0)
    _, ref_curve = reference_train(fresh, loaded, plan, RunOptions(steps=steps, optimizer="adamw", lr=1e-3))
    assert curve == pytest.approx(ref_curve, rel=1e-4)


def _torchrun(world: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           str(EXAMPLES / "train_parallelize.py"), "--model", "gpt", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.timeout(400)
def test_parallelize_checkpoint_written_at_one_plan_resumes_at_another(tmp_path):
    """FSDP dp2 x pp2 x tp2 saves after 2 steps; pp2 x tp2 on 4 processes goes on for 2 more: the loss curve
    is the untouched model's, and the checkpoint exports to a file the untouched model loads."""
    _torchrun(8, "--dp", "2", "--pp", "2", "--tp", "2", "--fsdp", "--steps", "2", "--save", str(tmp_path / "c"))
    r = _torchrun(4, "--pp", "2", "--tp", "2", "--steps", "2", "--resume", str(tmp_path / "c"))
    got = {int(a): float(b) for a, b in re.findall(r"step (\d+) loss (\S+)", r.stdout)}
    assert sorted(got) == [3, 4]

    loaded = load_model(str(EXAMPLES / "gpt.py"))
    plan = Plan(dp=2, pp=2, tp=2)
    _, ref_curve = reference_train(loaded.build("cpu", seed=0), loaded, plan, RunOptions(steps=4, optimizer="adamw", lr=1e-3))
    assert [got[3], got[4]] == pytest.approx(ref_curve[2:], rel=1e-4)
    names = export_weights(tmp_path / "c", tmp_path / "w.safetensors")
    assert set(names) == set(loaded.build("meta").state_dict())
