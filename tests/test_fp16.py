"""--autocast fp16: one loss scale for the whole world; an overflow on any rank skips the step on all."""

import re

import pytest

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training

from .conftest import MODELS

OVERFLOW = str(MODELS / "fp16_overflow.py")


def _steps(text: str) -> dict[int, str]:
    # up to the timings (after " | "), which differ from run to run
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"step\s+(\d+)\s+loss [^|]*", text)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fp16_overflow_skips_the_step_on_every_rank_and_matches_the_reference(capfd):
    """The 3D world of 8 (DDP x pp x tp): the overflow on some ranks skips the step on all of them."""
    lines: list[str] = []
    cmp = run_training(OVERFLOW, Plan(dp=2, pp=2, tp=2, autocast="fp16"), RunOptions(steps=5, check=True, timeout_s=240),
                       echo=lines.append)
    out = capfd.readouterr().out
    assert cmp is not None and cmp.ok, "\n".join(lines)
    steps = _steps(out)
    skipped = [n for n, line in steps.items() if "step skipped" in line]
    assert skipped and skipped == list(range(1, len(skipped) + 1)) and len(skipped) < 5, out
    assert any(f"step(s) {', '.join(map(str, skipped))} skipped" in line for line in lines)
    # after the skipped steps training moves, and the loss curve matched the reference's (checked above)
    assert steps[5].split()[3] != steps[1].split()[3]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fp16_resume_keeps_the_loss_scale(tmp_path, capfd):
    plan = Plan(pp=2, autocast="fp16")
    # --save-every 2: a checkpoint at step 2, in the middle of the overflows, to resume from
    run_training(OVERFLOW, plan, RunOptions(steps=5, save=str(tmp_path / "c"), save_every=2, timeout_s=200), echo=print)
    whole = _steps(capfd.readouterr().out)
    run_training(OVERFLOW, plan, RunOptions(steps=3, resume=str(tmp_path / "c" / "step-2"), timeout_s=200), echo=print)
    resumed = _steps(capfd.readouterr().out)
    assert resumed == {k: whole[k] for k in (3, 4, 5)}  # same losses and the same skipped steps
