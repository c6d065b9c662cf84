"""What the planner prices of the gradients' and FSDP's own memory traffic (planner/grad_traffic.py) is what
FSDP2 and DDP move on real processes: accumulation over micro-batches, DDP's bucket copies, FSDP2's
copy-out after each gather and copy-in before each reduce-scatter, counted op by op on 2 gloo ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict

import pytest

from graphsplit import Plan
from graphsplit.planner.dp_traffic import DpBytes
from graphsplit.planner.grad_traffic import grad_traffic_bytes

from .conftest import ROOT

# the worker's model (tests/workers/grad_copies.py): embed and head 48 x 48 with biases, two blocks of
# 48 -> 144 -> 48; its parameters' elements
ROOT_ELEMENTS = 2 * (48 * 48 + 48)
BLOCK_ELEMENTS = 48 * 144 + 144 + 144 * 48 + 48
FP32 = 4 * (ROOT_ELEMENTS + 2 * BLOCK_ELEMENTS)
REGIONS = 4 * 2 * BLOCK_ELEMENTS

CASES = {  # the worker's case: the plan whose program runs so, the gathered bytes
    "fsdp3": (Plan(dp=2, fsdp=True, autocast="bf16", microbatches=2), FP32 // 2),
    "fsdp2": (Plan(dp=2, fsdp=True, zero=2, autocast="bf16", microbatches=2), FP32 // 2),
    "fsdp_nosync": (Plan(dp=2, pp=2, fsdp=True, autocast="bf16", microbatches=2), FP32 // 2),
    "ddp": (Plan(dp=2, microbatches=2), FP32),
}


@pytest.fixture(scope="module")
def counted() -> dict[str, dict[str, int]]:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(ROOT / "tests" / "workers" / "grad_copies.py"), *CASES],
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    found: dict[str, dict[str, int]] = defaultdict(dict)
    for words in map(str.split, r.stdout.splitlines()):
        if len(words) == 4 and words[0] in CASES:
            found[words[0]][words[1]] = int(words[2])
    assert set(found) == set(CASES), r.stdout
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_priced_gradient_traffic_is_what_fsdp2_and_ddp_move(case, counted):
    plan, gathered = CASES[case]
    assert plan.fsdp_reshards == (case == "fsdp3") and (plan.num_stages > 1) == (case == "fsdp_nosync")
    priced = grad_traffic_bytes(plan, DpBytes(FP32, gathered, 0.0, REGIONS, 2))
    assert priced == sum(counted[case].values()), counted[case]


@pytest.mark.slow
def test_what_each_case_moves_is_the_kind_its_program_runs(counted):
    """The counts behind the totals: ZeRO-3 gathers every unit of a micro-batch's backward again but the
    root, ZeRO-2 once a step; only a deferred reduce-scatter (a pipeline) upcasts and accumulates unsharded
    gradients; DDP accumulates in fp32 and copies each gradient into its bucket and back."""
    bf16 = FP32 // 2
    assert counted["fsdp3"]["copy_out"] == 2 * 2 * (bf16 + bf16 * REGIONS // FP32)  # 2 micro-batches
    assert counted["fsdp2"]["copy_out"] == 2 * bf16
    assert set(counted["fsdp2"]) == set(counted["fsdp3"]) == {"copy_in", "copy_out"}
    assert counted["fsdp_nosync"]["upcast"] == bf16 + FP32 and counted["fsdp_nosync"]["accumulate"] == bf16 + 2 * FP32
    assert counted["ddp"] == {"accumulate": 3 * FP32, "bucket": 4 * FP32}


def test_plain_dp_under_a_split_backward_has_no_ddp_buckets_to_copy():
    """The zero-bubble schedules average plain dp's gradients after the step (runtime/grad_average.py), no
    DDP: only the accumulation over micro-batches is left."""
    moved = DpBytes(FP32, FP32, 0.0, REGIONS, 2)
    zbv = Plan(dp=2, pp=2, schedule="zbv", stages_per_rank=2, microbatches=4)
    assert grad_traffic_bytes(zbv, moved) == 3 * FP32 * 3
    assert grad_traffic_bytes(zbv.replace(schedule="interleaved-1f1b"), moved) == 3 * FP32 * 3 + 4 * FP32
