"""`parallelize()` from a user script under torchrun equals the untouched model."""

import os
import subprocess
import sys

import pytest
import torch

from graphsplit.check import compare, missing_grads, reference_step
from graphsplit.loader import load_model

from .conftest import EXAMPLES

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_parallelize_in_a_torchrun_script(tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(EXAMPLES / "train_parallelize.py"), "--model", "gpt", "--pp", "2", "--steps", "2", "--dump", str(tmp_path),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 2 loss" in r.stdout

    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("cpu", seed=0)
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, 2)
    dumps = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    losses = [d["loss"] for d in dumps if d["loss"] is not None]
    assert len(losses) == 1
    got = {}
    for d in dumps:
        cmp = compare(None, None, d["grads"], ref)
        assert cmp.ok, cmp.failures
        got.update(d["grads"])
    assert not missing_grads(ref, set(got))
    assert compare(losses[0], None, {}, ref).ok
