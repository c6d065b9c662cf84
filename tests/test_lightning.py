"""Lightning's Trainer trains an unmodified LightningModule (tests/models/lightning_gpt.py) under
`GraphsplitStrategy` as it trains it on one device with its default strategy, on the whole batch: each
step's loss, the loss it logs, its validation loss, its LR schedule and the weights after the last step,
with gradient accumulation and clipping by norm on; and a checkpoint saved at one plan resumes at another.
Each run is Lightning's own launcher starting the processes (tests/workers/lightning_fit.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import exported_weights

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "workers" / "lightning_fit.py"


def _fit(out: Path, *args: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, str(WORKER), "--out", str(out), *args], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=out)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return torch.load(out / "seen.pt", weights_only=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The module under Lightning's default strategy, one device, the whole batch of 8."""
    return _fit(tmp_path_factory.mktemp("reference"), "--reference", "--steps", "4")


def _same_training(seen: dict, reference: dict, steps: slice = slice(None)) -> None:
    for key in ("losses", "logged", "lrs"):
        assert seen[key] == pytest.approx(reference[key][steps], rel=1e-5), key
    assert seen["val"] == pytest.approx(reference["val"][:len(seen["val"])], rel=1e-5)


def _same_weights(checkpoint: Path, reference: dict) -> None:
    got = exported_weights(checkpoint)
    for name, tensor in reference["weights"].items():
        if name.endswith(".bias") and name not in got:  # the causal-mask buffer is not persistent
            continue
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


# tp 2 alone: the resume test below trains at tp 2 against the default strategy
@pytest.mark.parametrize("dp,pp,tp", [(1, 2, 1), (2, 2, 1)])
def test_trainer_under_graphsplit_equals_default_strategy(tmp_path, reference, dp, pp, tp):
    seen = _fit(tmp_path, "--dp", str(dp), "--pp", str(pp), "--tp", str(tp), "--steps", "4",
                "--save", str(tmp_path / "last.ckpt"))
    assert len(seen["losses"]) == 8 and len(seen["val"]) >= 2  # 4 steps of 2 batches; sanity check + evals
    _same_training(seen, reference)
    _same_weights(tmp_path / "last.ckpt", reference)


def test_trainer_plan_auto_equals_default_strategy_at_the_batch_it_trains(tmp_path, reference):
    """GraphsplitStrategy(plan="auto") on 4 processes, each replica's DataLoader yielding 4 samples: the plan
    the planner chose (rank 0's, taken by every rank) trains as the default strategy does on 4 x its dp
    samples a batch (Lightning's convention: the DataLoader's batch is each replica's, as under DDP)."""
    seen = _fit(tmp_path, "--auto", "--devices", "4", "--batch", "4", "--steps", "4", "--save", str(tmp_path / "last.ckpt"))
    plan = seen["plan"]
    assert plan is not None and plan["dp"] * plan["pp"] * plan["tp"] == 4 and plan["compile"] is False  # kept
    whole = 4 * plan["dp"]
    expected = reference if whole == 8 else _fit(tmp_path / "reference", "--reference", "--batch", str(whole),
                                                  "--steps", "4")
    _same_training(seen, expected)
    _same_weights(tmp_path / "last.ckpt", expected)


def test_checkpoint_saved_at_one_plan_resumes_at_another(tmp_path):
    """Two steps at pp 2 (one epoch), saved by trainer.save_checkpoint; resumed by trainer.fit(ckpt_path=...)
    at tp 2 for two more: its losses, LR schedule, validation and weights are those of the default strategy
    saving and resuming the same way (Lightning's resumed epoch does not replay the uninterrupted run's order)."""
    _fit(tmp_path / "ref_first", "--reference", "--steps", "2", "--save", str(tmp_path / "ref_half.ckpt"))
    reference = _fit(tmp_path / "ref_second", "--reference", "--steps", "4", "--resume", str(tmp_path / "ref_half.ckpt"))
    _fit(tmp_path / "first", "--pp", "2", "--steps", "2", "--save", str(tmp_path / "half.ckpt"))
    seen = _fit(tmp_path / "second", "--tp", "2", "--steps", "4", "--resume", str(tmp_path / "half.ckpt"),
                "--save", str(tmp_path / "last.ckpt"))
    assert len(seen["losses"]) == 4 and seen["lrs"][0] < 0.1  # two steps more, the schedule where it was
    _same_training(seen, reference)
    _same_weights(tmp_path / "last.ckpt", reference)


FABRIC = Path(__file__).parent / "workers" / "fabric_loop.py"


def _fabric(out: Path, *args: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, str(FABRIC), "--out", str(out), *args], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=out)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return torch.load(out / "seen.pt", weights_only=False)


@pytest.fixture(scope="module")
def fabric_reference(tmp_path_factory) -> dict:
    return _fabric(tmp_path_factory.mktemp("fabric_reference"), "--reference")


@pytest.mark.parametrize("dp,pp,tp", [(2, 1, 2)])  # the Trainer's tests run pp
def test_fabric_loop_under_graphsplit_equals_default_strategy(tmp_path, fabric_reference, dp, pp, tp):
    """A Fabric loop (setup, setup_dataloaders, backward of loss / 2 twice a step, clip_gradients, a validation
    loss under no_grad, save and load) under GraphsplitFabricStrategy at dp 2 x tp 2: its losses,
    gradient norms, validation loss and saved weights are the default strategy's on one device."""
    seen = _fabric(tmp_path, "--dp", str(dp), "--pp", str(pp), "--tp", str(tp))
    for key in ("losses", "norms"):
        assert seen[key] == pytest.approx(fabric_reference[key], rel=1e-5), key
    assert seen["val"] == pytest.approx(fabric_reference["val"], rel=1e-5)
    assert seen["step"] == fabric_reference["step"] == 3  # fabric.load put the loop's value back
    _same_weights(tmp_path / "ckpt", fabric_reference)
