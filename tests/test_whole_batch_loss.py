"""A loss that couples the samples while the model keeps them apart (CLIP's contrastive loss over the
batch x batch logits of two towers' embeddings, in loss_fn): found by batch discovery as the loss's
alone (analysis/batch: BatchDims.whole_loss), each replica's share runs as one micro-batch, and under
data parallelism every replica gathers the replicas' embeddings before the loss (runtime/whole_batch.py),
so the loss and every gradient are the whole batch's. Where the model itself pairs the samples (its
output holds the batch twice: image x text logits made in forward), the batch cannot be cut at all."""

import pytest

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally

from .conftest import MODELS, traced_once

MODEL = MODELS / "two_towers.py"


def test_the_loss_alone_couples_the_samples_and_each_replica_runs_one_micro_batch():
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.inputs == {"image": 0, "tokens": 0} and program.batch.outputs[:2] == (0, 0)
    assert "two_towers.py:41 in loss_fn" in program.batch.whole_loss
    assert program.plan.num_microbatches == 1
    _, cmp = check_locally(loaded, Plan(tp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures


def test_what_cannot_run_a_whole_batch_loss_is_refused_in_one_line():
    loaded, traced = traced_once(MODEL)
    with pytest.raises(GraphsplitError, match=r"^--microbatches 2: the loss couples the samples \(.*two_towers.py:41"):
        check_locally(loaded, Plan(pp=2, microbatches=2), traced=traced.copy())
    with pytest.raises(GraphsplitError, match="the local backend runs dp replicas one after the other, and the loss "
                                              "couples the samples"):
        check_locally(loaded, Plan(dp=2), traced=traced.copy())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_real_processes_each_replica_gathers_the_embeddings():
    lines: list[str] = []
    cmp = run_training(str(MODEL), Plan(dp=2, pp=2), RunOptions(steps=2, check=True, timeout_s=240), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("the loss couples the samples" in line for line in lines)
    assert any("untouched model in one process on the whole global batch" in line for line in lines)
