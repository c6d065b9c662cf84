"""A loss computed in chunks of the flattened tokens (analysis/batch/chunks.py): each chunk holds rows of
several samples, cut elsewhere by another batch size, yet where the chunks are put back in order
(litgpt's `torch.cat(loss_chunks).sum()`) or each summed and added up, the loss is the whole batch's
however the batch is cut: the batch is found through them and the plan's micro-batches and replicas
train it, the count of counted tokens taken over the whole global batch (`count.clamp(min=1)`, litgpt's
`.maximum(torch.ones_like(count))`: the floor once, on the global count). A mean over each chunk, or one
chunk alone, weighs rows by where the cut fell: one micro-batch, said. Against the untouched model on the
whole batch, prompts masked unevenly (each piece counts other tokens). litgpt's GPT and its own
chunked_cross_entropy, unchanged, run on real processes in the outside zoo (tests/test_outside_zoo.py)."""

import pytest

from graphsplit import Plan
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS

CHUNKED = MODELS / "chunked_losses.py"
LITGPT = MODELS / "outside" / "litgpt_tiny.py"


def _variant(tmp_path, loss):
    path = tmp_path / f"{loss}.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(MODELS)!r})\nfrom chunked_losses import *  # noqa\n"
                    f"from chunked_losses import {loss} as loss_fn  # noqa\n")
    return load_model(str(path))


@pytest.mark.parametrize("path", [CHUNKED, LITGPT], ids=["summed-chunks", "litgpt"])
def test_chunks_put_back_or_summed_keep_the_batch_and_count_over_the_global_batch(path):
    loaded = load_model(str(path))
    program, cmp = check_locally(loaded, Plan(dp=2, pp=2))
    assert cmp.ok, cmp.failures
    batch = program.batch
    assert batch.inputs == {name: 0 for name in batch.inputs} and batch.target == (0,) and not batch.whole_loss
    assert program.plan.num_microbatches == 2
    [count] = program.token_means.counts
    assert count.what == "masked mean" and count.reads == "target"
    assert count.at_least == 1.0  # `clamp(min=1)`, `maximum(ones_like(count))`: the floor kept, on the whole count


def test_a_loss_traced_through_its_chunks_unrolls_them_and_checks_their_count():
    from graphsplit.rewrite import rewrite_loaded

    program = rewrite_loaded(load_model(str(CHUNKED)), Plan(dp=2, pp=2)).program
    code = program.token_means.loss_gm.code
    # one replica's micro-batch: 1 sequence of 10 tokens, chunks of 12 rows: one chunk, its count checked
    assert code.count("cross_entropy(") == 1 and "took len() = 1" in code


@pytest.mark.parametrize("loss, why", [
    ("chunk_means_loss", r"nll_loss_forward's mean over one chunk of it at chunked_losses.py:\d+"),
    ("first_chunk_loss", r"nll_loss_forward's mean over one chunk of it at chunked_losses.py:\d+ in first_chunk_loss"),
])
def test_a_mean_over_each_chunk_weighs_rows_by_the_cut_and_keeps_the_batch_whole(tmp_path, loss, why):
    import re

    program, cmp = check_locally(_variant(tmp_path, loss), Plan(pp=2))  # (dp: on real processes only)
    assert cmp.ok, cmp.failures
    assert re.search(why, program.batch.whole_loss), program.batch.whole_loss
    assert program.plan.num_microbatches == 1
