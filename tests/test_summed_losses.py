"""A loss summed over the samples is the sum of its pieces' losses, where a mean is their average.

Batch discovery finds the sums that add the samples up (analysis/batch/sums.py: a sum whose value holds
the batch, or elements picked from it, and whose output does not); the token-mean pass scales each so
the micro-batches and replicas add up (passes/token_mean.py, a mean with no count). A sum divided by a
size read from the data is a mean of its piece, and stays averaged. Each loss is checked against the
untouched model on the whole batch (loss, output, every rank's gradient), at dp 2 x pp 2: four pieces,
so a sum averaged as equals would be a quarter of the whole batch's. The outside zoo's
attention-is-all-you-need (a label-smoothed loss of the non-pad tokens, `masked_select(...).sum()`, against
a target flattened to batch x length) is checked so in tests/test_outside_zoo.py."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally

from .conftest import MODELS, traced_once

SUMMED = ["sum over the samples"]
LOSSES = {
    "sum": (lambda o, y: ((o - y) ** 2).sum(), SUMMED),
    "sum over a constant": (lambda o, y: ((o - y) ** 2).sum() / 64, SUMMED),
    "summed mse plus a mean": (lambda o, y: F.mse_loss(o, y, reduction="sum") + 0.5 * F.l1_loss(o, y), SUMMED),
    "a mask's selection summed": (lambda o, y: (o - y).pow(2).masked_select(y > 0).sum(), SUMMED),
    "per-sample sums averaged": (lambda o, y: (o - y).pow(2).sum(dim=(1, 2)).mean(), []),
    "sum over the batch's size": (lambda o, y: ((o - y) ** 2).sum() / o.size(0), []),
    "sum times one over the batch's size": (lambda o, y: ((o - y) ** 2).sum() * (1 / o.size(0)), []),
    "a sum of means": (lambda o, y: torch.stack([F.mse_loss(o, y), o.abs().mean()]).sum(), []),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_hand_written_loss_equals_the_whole_batchs(name):
    loss_fn, found = LOSSES[name]
    loaded, traced = traced_once(MODELS / "summed_losses.py")
    program, cmp = check_locally(dataclasses.replace(loaded, loss_fn=loss_fn), Plan(dp=2, pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    counts = program.token_means.counts if program.token_means is not None else ()
    assert [c.what for c in counts] == found


def test_a_target_flattened_to_batch_by_length_is_cut_with_the_batch():
    """The target comes as seq2seq scripts feed it, `gold.view(-1)`: its one dim stands for the batch
    and the length merged, the batch outer, so its pieces are whole samples' tokens."""
    loaded, traced = traced_once(MODELS / "summed_losses.py")
    gold = torch.randint(0, 4, (8, 5), generator=torch.Generator().manual_seed(3)).view(-1)

    def loss_fn(out, gold):
        return F.cross_entropy(out.reshape(-1, out.size(-1)), gold, reduction="sum")

    program, cmp = check_locally(dataclasses.replace(loaded, loss_fn=loss_fn, target=gold), Plan(dp=2, pp=2),
                                 traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.target == (0,) and program.batch.size == 8
    assert [c.what for c in program.token_means.counts] == ["summed cross-entropy"]


def test_a_target_flattened_length_first_is_refused_in_one_line():
    """Flattened from [length, batch], each piece of the target would hold every sample's first tokens."""
    loaded, traced = traced_once(MODELS / "summed_losses.py")
    gold = torch.randint(0, 4, (5, 8), generator=torch.Generator().manual_seed(3)).reshape(-1)

    def loss_fn(out, gold):
        return F.cross_entropy(out.transpose(0, 1).reshape(-1, out.size(-1)), gold)

    with pytest.raises(GraphsplitError) as exc:
        check_locally(dataclasses.replace(loaded, loss_fn=loss_fn, target=gold), Plan(dp=2, pp=2), traced=traced.copy())
    assert "dim 0 of target leaf 0 holds the batch merged after another dim" in str(exc.value)
    assert "\n" not in str(exc.value)
