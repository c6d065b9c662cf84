"""A loss that couples the samples while the model keeps them apart (CLIP's contrastive loss over the
batch x batch logits of two towers' embeddings, in loss_fn): found by batch discovery as the loss's
alone (analysis/batch: BatchDims.whole_loss), each replica's share runs as one micro-batch, and under
data parallelism every replica gathers the replicas' embeddings before the loss (runtime/whole_batch.py),
so the loss and every gradient are the whole batch's. Where the model itself pairs the samples at its end
(image x text logits, its contrastive loss, made in forward), the graph gathers the values that tail reads
(analysis/batch/tail.py, passes/replica_gather.py); a tail that reads a weight leaves no batch."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.ops.replica_gather import gather_replicas
from graphsplit.rewrite import rewrite_loaded, rewrite_program

from .conftest import MODELS, traced_once

MODEL = MODELS / "two_towers.py"
IN_FORWARD = MODELS / "contrastive_in_forward.py"


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


def test_a_model_whose_own_tail_pairs_the_samples_gathers_before_the_tail():
    """The model makes the logits and its contrastive loss in forward: the batch is cut at the towers'
    inputs, the tail's inputs (the two normalized embeddings) are gathered over the replicas, the tail's
    outputs are whole (the same on every replica) and the embeddings the model returns stay a row each."""
    loaded, traced = traced_once(IN_FORWARD)
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    batch = program.batch
    assert batch.inputs == {"image": 0, "tokens": 0} and batch.outputs == (None, None, 0)
    assert "contrastive_in_forward.py:27 in forward" in batch.whole_loss
    assert len(batch.gather) == 2 and sorted(d for _, d, _ in batch.gather) == [0, 1]  # image rows, texts transposed
    assert program.plan.num_microbatches == 1
    _, cmp = check_locally(loaded, Plan(tp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    dp = rewrite_loaded(loaded, Plan(dp=2, pp=2), traced=traced.copy()).program
    calls = [n for stage in dp.stages for n in stage.gm.graph.nodes if n.target is gather_replicas]
    assert len(calls) == 2 and all(n.args[1] in (0, 1) for n in calls)
    with pytest.raises(GraphsplitError, match="the local backend runs dp replicas one after the other"):
        check_locally(loaded, Plan(dp=2), traced=traced.copy())


def test_a_loss_whose_labels_count_the_samples_is_not_cut_where_they_restart():
    """Every image-text pair scored by a learned layer, the loss's labels `arange(n)`: sample i's class is
    i, its position in the whole batch, so neither tower's batch can be cut where the labels would
    restart at 0 (this ran as two micro-batches and trained another loss). The texts are cut and the
    scores gathered before the loss; the images, paired with every text by a weight, go whole."""
    loaded, traced = traced_once(MODELS / "pairwise_scorer.py")
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    batch = program.batch
    assert batch.inputs == {"image": None, "tokens": 0} and program.plan.num_microbatches == 1
    assert [(name, dim) for name, dim, _ in batch.gather] == [("squeeze", 1)]


class _Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class _DeepTowers(torch.nn.Module):
    """Images through four alike residual blocks whose last output the logits read directly: the
    analyses answer the fourth block by the third's values (analysis/repeated_blocks.py)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Residual() for _ in range(4)])
        self.text = torch.nn.Embedding(16, 6)

    def forward(self, image, tokens):
        h = image
        for block in self.blocks:
            h = block(h)
        logits = h @ self.text(tokens).mean(1).t()
        return -torch.log_softmax(logits, 1).diagonal().mean()  # image i's text is text i


def test_a_tail_reading_a_repeated_blocks_output_gathers_it(monkeypatch):
    """The logits read the fourth block's output, which batch discovery answers by the third's values:
    it is gathered all the same, as when every block runs."""
    import graphsplit.analysis.batch.runner as runner

    model, image, tokens = _DeepTowers(), torch.randn(8, 6), torch.randint(0, 16, (8, 3))

    def gathered() -> list[tuple[str, int]]:
        batch = rewrite_program(model, (image, tokens), {}, Plan(dp=2), loss_fn=lambda out, _: out).program.batch
        assert batch.inputs == {"image": 0, "tokens": 0}
        return [(name, dim) for name, dim, _ in batch.gather]

    assert gathered() == [("add_3", 0), ("t", 1)]
    monkeypatch.setattr(runner, "repeated_blocks", lambda gm: None)
    assert gathered() == [("add_3", 0), ("t", 1)]
