"""`parallelize()` from a user script under torchrun equals the untouched model."""

import os
import subprocess
import sys

import pytest
import torch

from graphsplit import Plan
from graphsplit.check import compare, missing_grads, reference_step
from graphsplit.compile import compile_loaded
from graphsplit.loader import load_model
from graphsplit.sharding import shard_tensor

from .conftest import EXAMPLES

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pp, tp", [(2, 1), (2, 2)])
def test_parallelize_in_a_torchrun_script(tmp_path, pp, tp):
    world = pp * tp
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
        str(EXAMPLES / "train_parallelize.py"), "--model", "gpt", "--pp", str(pp), "--tp", str(tp),
        "--steps", "2", "--dump", str(tmp_path),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 2 loss" in r.stdout

    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("cpu", seed=0)
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, 2)
    program = compile_loaded(loaded, Plan(pp=pp, tp=tp)).program
    dumps = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    losses = [d["loss"] for d in dumps if d["loss"] is not None]
    assert len(losses) == tp  # every tp rank of the last stage has the loss
    got = {}
    for d in dumps:
        def shard(name, full, r=d["tp_rank"]):
            return shard_tensor(full, program.param_sharding(name), r, tp)

        cmp = compare(None, None, d["grads"], ref, expected=shard)
        assert cmp.ok, cmp.failures
        got.update(d["grads"])
    assert not missing_grads(ref, set(got))
    assert compare(losses[0], None, {}, ref).ok
