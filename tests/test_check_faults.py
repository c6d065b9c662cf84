"""`run --check` fails a wrong program: errors a real bug makes, injected on purpose into real processes
(graphsplit/launch/faults.py, `GRAPHSPLIT_FAULT`), under fp32 and bf16 (the smallest, a gradient 10% off,
under fp16 too), and each failure
names what it saw (the tensor, the rank). The same plans without a fault pass: the tolerance that lets
a healthy bf16 program through (its gradients included) does not let a gradient 10% off through.

And the check's own holes: what it compares must be there (every rank's outputs, every step of the
loss curve, every rank's weights), or it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import MODELS

pytestmark = pytest.mark.slow

MODEL = str(MODELS / "shallow_gpt.py")  # the GPT example two blocks deep: cross-entropy over a vocabulary

# fault -> (the plan it needs, what a failure must name)
FAULTS = {
    # rank 1 is tp rank 1: its first gradient (a tp shard of the first block's fused attention weight)
    "scale_grad@1": (["--tp", "2"], "rank 1: grad "),
    # the outputs of the micro-batch trained twice stand where the dropped one's should
    "drop_microbatch": (["--microbatches", "2"], "output[0]"),
    # a wrong weight shard on tp rank 1 changes what every tp rank computes
    "shift_shard@1": (["--tp", "2"], "output[0]"),
    "no_dp_reduce": (["--dp", "2"], "rank 0: grad "),
}


def _run(plan: list[str], fault: str | None, autocast: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRAPHSPLIT_FAULT": fault or ""}
    extra = ["--autocast", autocast] if autocast else []
    return subprocess.run([sys.executable, "-m", "graphsplit", "run", MODEL, *plan, *extra, "--steps", "2",
                           "--check", "--timeout", "120"], capture_output=True, text=True, timeout=300, env=env)


# the 10% gradient error, the smallest fault, under every precision; the others, whose errors are larger,
# under fp32 and bf16 (the widest tolerance)
CASES = [(fault, autocast) for fault in FAULTS for autocast in (None, "bf16", "fp16")
         if fault.startswith("scale_grad") or autocast != "fp16"]


@pytest.mark.parametrize("fault, autocast", CASES, ids=[f"{f}-{a or 'fp32'}" for f, a in CASES])
def test_check_fails_an_injected_error(fault, autocast):
    plan, named = FAULTS[fault]
    done = _run(plan, fault, autocast)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "check FAILED" in out, out[-3000:]
    mismatches = [line.strip().removeprefix("MISMATCH ") for line in out.splitlines() if "MISMATCH" in line]
    assert any(m.startswith(named) for m in mismatches), mismatches
    assert "Traceback" not in out
    if fault.startswith("scale_grad"):  # every step's: SGD carries it into the weights, 10% of their update
        assert any(m.startswith("rank 1: weight ") for m in mismatches), mismatches


def test_the_same_plans_pass_without_a_fault_gradients_compared_in_bf16():
    """dp 2 x tp 2 x 2 micro-batches (every plan the faults above use), healthy, in bf16, the precision
    with the widest tolerance: the gradients are compared too, within the untouched model's own spread
    under torch.autocast. (Healthy fp32 and fp16 programs pass throughout the suite: tests/test_fp16.py.)"""
    done = _run(["--dp", "2", "--tp", "2", "--microbatches", "2"], None, "bf16")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "check passed" in out, out[-3000:]
    assert "gradients     " in out and "not compared" not in out
    assert "the untouched model under torch.autocast" in out, out[-2000:]


@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_what_the_check_compares_must_be_there(autocast):
    """tp rank 1 reports a wrong output (tp rank 0's is right), the last stage's loss curve is one step
    short, rank 1 writes no weights: three mismatches, each named."""
    done = _run(["--tp", "2"], "scale_output@1,short_curve,no_weights@1", autocast)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "check FAILED" in out, out[-3000:]
    assert "MISMATCH tp rank 1: output[0]: relative error" in out
    assert "MISMATCH loss curve: the program reported 1 steps, the reference ran 2" in out
    assert "MISMATCH weights after the last step: rank(s) [1] wrote none" in out


def test_an_unknown_fault_is_one_line_before_anything_starts():
    done = _run(["--tp", "2"], "scale_grads@1", None)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "unknown fault 'scale_grads'" in out, out[-2000:]
    assert "Traceback" not in out and "launching" not in out
