"""embedding_bag with offsets (recommendation models' categorical features): where every bag holds one
index, the indices and the offsets are cut with the batch and each piece's offsets are counted from its
first, checked (passes/bag_offsets.py, ops/bags.py); bags of other sizes cannot be cut, found or
refused in one line. DLRM's own file is in the outside zoo (tests/test_outside_zoo.py)."""

import pytest
import torch
import torch.nn as nn

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally
from graphsplit.ops.bags import own_offsets
from graphsplit.rewrite import rewrite_loaded, rewrite_program

from .conftest import MODELS, traced_once

MODEL = MODELS / "bag_features.py"


def test_one_index_per_bag_is_cut_with_the_batch():
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, Plan(dp=2, pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    assert program.batch.inputs == {"dense": 0, "indices": 1, "offsets": 1}
    assert program.plan.num_microbatches == 2
    built = rewrite_loaded(loaded, Plan(pp=2), traced=traced.copy()).program
    calls = [n for stage in built.stages for n in stage.gm.graph.nodes if n.target is own_offsets]
    assert len(calls) == 2 and all("bag_features.py:21" in n.args[2] for n in calls)


def test_each_piece_of_the_offsets_is_its_own_and_checked():
    whole = torch.arange(8)
    pieces = whole.tensor_split(4)
    indices = torch.zeros(2, dtype=torch.long)
    assert all(torch.equal(own_offsets(indices, p, "m.py:1"), torch.arange(2)) for p in pieces)
    # bags of 1, 2, 1, 0 indices: the second piece does not start where its indices do
    with pytest.raises(GraphsplitError, match=r"^embedding_bag at m.py:1: graphsplit cuts its indices and offsets"):
        own_offsets(indices, torch.tensor([1, 3]), "m.py:1")
    # a piece whose own bags are not one index each
    with pytest.raises(GraphsplitError, match="4 indices, 2 offsets from 0"):
        own_offsets(torch.zeros(4, dtype=torch.long), torch.tensor([0, 2]), "m.py:1")
    with pytest.raises(GraphsplitError, match="2 offsets from 0"):
        own_offsets(indices, torch.tensor([0, 2]), "m.py:1")


def test_bags_of_several_indices_are_not_cut():
    class TwoPerBag(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(10, 4, mode="sum")

        def forward(self, indices, offsets):
            return self.bag(indices, offsets)

    args = (torch.randint(0, 10, (16,)), torch.arange(0, 16, 2))
    program = rewrite_program(TwoPerBag(), args, {}, Plan()).program
    assert not program.batch.batched
    assert any("embedding_bag's offsets are positions in its indices" in n for n in program.batch.notes)
