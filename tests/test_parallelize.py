"""`parallelize()` from a user script under torchrun equals the untouched model."""

import os
import re
import subprocess
import sys

import pytest
import torch

from graphsplit import Plan
from graphsplit.ir.sharding import shard_tensor
from graphsplit.launch.parity import compare, missing_grads
from graphsplit.launch.reference import (
    precise_step,
    reference_step,
    reference_train,
    reordered_step,
)
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.dcp.state import export_weights

from .conftest import EXAMPLES

pytestmark = pytest.mark.slow


def _torchrun(world: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           str(EXAMPLES / "train_parallelize.py"), "--model", "gpt", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


STEPS = 5


@pytest.fixture(scope="module")
def fsdp_3d(tmp_path_factory):
    """One FSDP dp2 x pp2 x tp2 run of the example script (8 processes) that both tests below read:
    step 1 dumped per rank, the loss curve, and a checkpoint after the last step."""
    folder = tmp_path_factory.mktemp("fsdp_3d")
    r = _torchrun(8, "--dp", "2", "--pp", "2", "--tp", "2", "--fsdp", "--steps", str(STEPS), "--dump", str(folder),
                  "--save", str(folder / "c"))
    assert "step 2 loss" in r.stdout
    return folder


def _matches_untouched_model(folder, dp, pp, tp, fsdp):
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("cpu", seed=0)
    plan = Plan(dp=dp, pp=pp, tp=tp, fsdp=fsdp)
    # the untouched model on the whole batch, one forward and one backward (no BatchNorm: nothing in it
    # depends on how the batch is cut), and its own spread (float64, another summation order)
    step = (loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn)
    ref, precise, reordered = reference_step(model, *step), precise_step(model, *step), reordered_step(model, *step)
    program = rewrite_loaded(loaded, plan).program
    dumps = [torch.load(folder / f"rank{r}.pt") for r in range(plan.world_size)]
    for d in dumps:  # FSDP: each rank stores about 1/dp of its shards (dim 0 split, so not exactly)
        assert d["held"] <= (0.6 * d["whole"] if fsdp else d["whole"]) and d["held"] > 0.4 * d["whole"]
    losses = [d["loss"] for d in dumps]
    assert all(loss is not None for loss in losses)  # every rank holds the loss, as under DDP
    got = {}
    for d in dumps:
        def shard(name, full, r=d["tp_rank"]):
            return shard_tensor(full, program.param_sharding(name), r, tp)

        cmp = compare(None, None, d["grads"], ref, expected=shard, precise=precise, reordered=reordered)
        assert cmp.ok, cmp.failures
        got.update(d["grads"])
    assert not missing_grads(ref, set(got))
    assert all(compare(loss, None, {}, ref, precise=precise, reordered=reordered).ok for loss in losses)

    # the AdamW loss curve of the untouched model, trained on the whole batch each step
    curve = torch.load(next(folder.glob("losses*.pt")))
    _, ref_curve = reference_train(loaded.build("cpu", seed=0), loaded, plan, STEPS, "adamw", 1e-3)
    assert curve == pytest.approx(ref_curve, rel=1e-4)


@pytest.mark.timeout(400)
def test_parallelize_3d_with_fsdp(fsdp_3d):
    _matches_untouched_model(fsdp_3d, 2, 2, 2, True)


@pytest.mark.timeout(400)
def test_parallelize_checkpoint_written_at_one_plan_resumes_at_another(fsdp_3d, tmp_path):
    """The FSDP dp2 x pp2 x tp2 run saved after its last step; dp2 x pp2 with ZeRO-1 (`make_optimizer`: AdamW's
    states sharded over the replicas) on 4 processes goes on for 2 more: the loss curve is the untouched
    model's, and the checkpoint exports to a file the untouched model loads."""
    r = _torchrun(4, "--dp", "2", "--pp", "2", "--zero", "1", "--steps", "2", "--resume", str(fsdp_3d / "c"))
    got = {int(a): float(b) for a, b in re.findall(r"step (\d+) loss (\S+)", r.stdout)}
    assert sorted(got) == [STEPS + 1, STEPS + 2]

    loaded = load_model(str(EXAMPLES / "gpt.py"))
    plan = Plan(dp=2, pp=2, tp=2)
    _, ref_curve = reference_train(loaded.build("cpu", seed=0), loaded, plan, STEPS + 2, "adamw", 1e-3)
    assert [got[STEPS + 1], got[STEPS + 2]] == pytest.approx(ref_curve[STEPS:], rel=1e-4)
    names = export_weights(fsdp_3d / "c", tmp_path / "w.safetensors")
    assert set(names) == set(loaded.build("meta").state_dict())
