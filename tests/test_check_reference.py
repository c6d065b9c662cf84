"""--check compares with the untouched model on the whole global batch (one forward, one backward),
names what legitimately differs (BatchNorm per piece, random ops), and loads unseeded model files alike
everywhere (graphsplit issue 21, items 5 and 6)."""

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graphsplit import Plan
from graphsplit.ir.op_kinds import Randomness, randomness
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import check_locally
from graphsplit.launch.random_ops import find_random_ops, no_dropout
from graphsplit.launch.reference import reference_step
from graphsplit.launch.reference_batch import reference_batch
from graphsplit.loader import load_model

from .conftest import EXAMPLES, MODELS


def _step(loaded, pieces, seed=0):
    model = loaded.build("cpu", seed=seed)
    return reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, pieces)


# ---- item 5: the whole batch ---------------------------------------------------------------------

def test_the_check_catches_what_only_the_whole_batch_shows():
    """A model that sorts its examples against each other, cut into micro-batches (batch discovery
    takes the sort for routing and says so): graphsplit's own micro-batches agree with it (the old
    reference passed), the whole batch does not."""
    loaded = load_model(str(MODELS / "sorted_batch.py"))
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert program.plan.num_microbatches == 2
    assert not cmp.ok
    assert any(f.split(": ", 1)[-1].startswith("loss:") or f.startswith("loss:") for f in cmp.failures), cmp.failures
    # the micro-batched reference agrees with the program: that reference proved nothing here
    whole, cut = _step(loaded, 1), _step(loaded, 2)
    assert abs(float(whole.loss) - float(cut.loss)) > 1e-4
    assert cmp.notes == []


def test_a_loss_over_unevenly_padded_tokens_equals_the_whole_batch():
    """Micro-batches' means averaged as equals are not the whole batch's mean (the reference on the
    program's pieces differs), yet the check against the whole batch passes: each mean over counted
    tokens is normalized by the global count (passes/token_mean.py)."""
    loaded = load_model(str(MODELS / "ignore_index.py"))
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert program.plan.num_microbatches == 2
    assert cmp.ok, cmp.failures
    whole, cut = _step(loaded, 1), _step(loaded, 2)
    assert abs(float(whole.loss) - float(cut.loss)) > 1e-4
    assert cmp.notes == []


def test_batchnorm_per_micro_batch_is_named_and_compared_per_micro_batch():
    loaded = load_model(str(EXAMPLES / "resnet.py"))
    _, cmp = check_locally(loaded, Plan(pp=2))
    assert cmp.ok, cmp.failures
    (note,) = cmp.notes
    assert note.startswith("BatchNorm stem.1, layers.0.bn1") and "2 micro-batches" in note
    assert "compared with the untouched model on the program's 2 micro-batches" in note
    # and the whole batch does differ there: the note is needed
    assert (_step(loaded, 1).output - _step(loaded, 2).output).abs().max() > 1e-3


def test_which_batch_the_reference_runs_on():
    model = load_model(str(EXAMPLES / "resnet.py")).build("cpu")
    assert reference_batch(model, Plan()).whole
    assert reference_batch(model, Plan(dp=2, sync_bn=True, microbatches=1)).whole  # the replicas joined: all of it
    joined = reference_batch(model, Plan(dp=2, pp=2, sync_bn=True))
    assert (joined.pieces, joined.replicas) == (4, 2) and "joined over the 2 replicas" in joined.why
    apart = reference_batch(model, Plan(dp=2))
    assert (apart.pieces, apart.replicas) == (2, 1) and "2 replicas (no --sync-bn)" in apart.why
    assert reference_batch(model.eval(), Plan(dp=2)).whole  # running statistics: no batch coupling
    mlp = load_model(str(EXAMPLES / "mlp.py")).build("cpu")
    assert reference_batch(mlp, Plan(dp=2, pp=2)).whole


# ---- item 5: random ops --------------------------------------------------------------------------

class _Spellings(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.off = nn.Dropout(0.0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x = F.dropout(self.lin(x), 0.2, self.training)
        x = F.dropout(x, 0.3, False)  # inference: not random
        noise = torch.randn_like(x) + x.bernoulli(0.5)
        return self.off(self.drop(x)) + noise


def test_random_ops_are_classified_in_every_spelling():
    gm = fx.symbolic_trace(_Spellings())
    found = {n.name: randomness(n, gm) for n in gm.graph.nodes if randomness(n, gm) is not None}
    assert found == {"dropout": Randomness.DROPOUT, "drop": Randomness.DROPOUT, "randn_like": Randomness.DRAW,
                     "bernoulli": Randomness.DRAW}
    exported = torch.export.export(_Spellings(), (torch.randn(2, 4),), strict=False).module()
    kinds = sorted(k.value for n in exported.graph.nodes if (k := randomness(n, exported)) is not None)
    assert kinds == ["draw", "draw", "dropout", "dropout"]
    ops = find_random_ops(gm)
    assert ops.dropouts == ("the model (dropout)", "drop") and ops.draws == ("the model (randn_like)", "the model (bernoulli)")


def test_no_dropout_is_the_identity_in_training():
    x = torch.randn(6, 5, requires_grad=True)
    with no_dropout():
        for y in (nn.Dropout(0.5)(x), F.dropout(x, p=0.9), torch.ops.aten.native_dropout.default(x, 0.5, True)[0],
                  nn.Dropout2d(0.5)(x.view(1, 6, 5, 1)).view(6, 5)):
            assert torch.equal(y, x)
    assert not torch.equal(nn.Dropout(0.5)(x), x)  # outside, dropout as usual


@pytest.mark.parametrize("plan", [Plan(pp=2), Plan(tp=2)], ids=["pp2", "tp2"])
def test_dropout_is_compared_switched_off_and_said_so(plan):
    # the dropout model's masks cannot match across ranks: it failed --check before, whatever was right
    _, cmp = check_locally(load_model(str(MODELS / "dropout.py")), plan)
    assert cmp.ok, cmp.failures
    (note,) = cmp.notes
    assert note.startswith("dropout in drop, drop2: compared with dropout off (p=0)")


def test_random_draws_match_in_one_piece_and_are_named_where_they_cannot():
    loaded = load_model(str(MODELS / "label_drop.py"))  # DiT's class-label dropout: torch.rand in a module
    _, cmp = check_locally(loaded, Plan())
    assert cmp.ok, cmp.failures
    assert cmp.notes == ["random draws in y_embedder (rand): drawn from the same seeded stream in the program "
                         "(one stage, one piece of the batch) and the untouched model"]
    # two tp ranks draw alike, as processes seeded alike do (threads: each from its own copy of the generator,
    # backends/threads.py SameDraws); the check still says the program need not draw as the model does
    _, cmp = check_locally(loaded, Plan(tp=2))
    assert cmp.ok, cmp.failures
    (note,) = cmp.notes
    assert note.startswith("random draws in y_embedder (rand): the program and the untouched model need not draw alike")
    # the same draws on each thread, whatever the interleaving: a stage of pp 2 draws a piece's labels
    _, cmp = check_locally(loaded, Plan(tp=2, pp=2))
    assert "random draws in y_embedder" in cmp.notes[0]


# ---- item 6: unseeded model files ----------------------------------------------------------------

def test_an_unseeded_model_file_loads_the_same_batch_whatever_ran_before():
    torch.manual_seed(123)
    first = load_model(str(MODELS / "unseeded.py"))
    torch.rand(1000)
    state = torch.get_rng_state()
    second = load_model(str(MODELS / "unseeded.py"))
    assert torch.equal(first.args[0], second.args[0]) and torch.equal(first.target, second.target)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's stream is left as it was
    other = load_model(str(MODELS / "unseeded.py"), seed=1)  # the plan's seed decides
    assert not torch.equal(first.args[0], other.args[0])


def test_an_unseeded_model_file_builds_the_same_model_whatever_python_and_numpy_drew_before():
    import random

    import numpy as np

    loaded = load_model(str(MODELS / "unseeded.py"))
    built = []
    for _ in range(2):
        random.random(), np.random.rand()  # each process's generators are elsewhere
        model = loaded.build("cpu", seed=0)
        built.append((model.net[0].out_features, model.order.tolist()))
    assert built[0] == built[1]
    widths = {loaded.build("cpu", seed=s).net[0].out_features for s in range(8)}
    assert len(widths) > 1  # the seed decides: the draws are not constant


def test_an_unseeded_model_file_checks_at_pp1():
    _, cmp = check_locally(load_model(str(MODELS / "unseeded.py")), Plan())
    assert cmp.ok, cmp.failures


# ---- real processes ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_unseeded_model_file_passes_the_real_check_at_pp2():
    torch.rand(77)  # this process's stream is elsewhere than a fresh rank's
    lines: list[str] = []
    cmp = run_training(str(MODELS / "unseeded.py"), Plan(pp=2), RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("on the whole global batch (one forward, one backward)" in line for line in lines), lines


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_real_check_runs_dropout_off_on_the_ranks_and_says_so():
    lines: list[str] = []
    cmp = run_training(str(MODELS / "dropout.py"), Plan(pp=2), RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any(line.startswith("  note: dropout in drop, drop2") for line in lines), lines


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sync_bn_with_one_micro_batch_per_replica_equals_the_whole_batch():
    lines: list[str] = []
    plan = Plan(dp=2, sync_bn=True, microbatches=1)
    cmp = run_training(str(EXAMPLES / "resnet.py"), plan, RunOptions(steps=2, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("on the whole global batch (one forward, one backward)" in line for line in lines), lines
    # --sync-bn with one micro-batch per replica normalizes over the whole batch: no BatchNorm note
    assert not any("BatchNorm" in line for line in lines), lines


class _Leaves(nn.Module):
    """torch.nn's own layers are fx leaves: their dropouts are inside the call_module."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1)
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.2)
        self.quiet = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)

    def forward(self, x):
        x = self.layer(x)
        return self.quiet(self.attn(x, x, x)[0] + F.scaled_dot_product_attention(x, x, x, dropout_p=0.1))


def test_dropout_inside_torch_layers_and_attention_is_found_and_switched_off():
    model = _Leaves()
    gm = fx.symbolic_trace(model)
    ops = find_random_ops(gm)
    assert ops.dropouts == ("layer", "attn", "the model (scaled_dot_product_attention)") and ops.draws == ()
    quiet = _Leaves()
    for m in quiet.modules():  # the same model with every dropout at 0
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
    quiet.load_state_dict(model.state_dict())
    x = torch.randn(5, 2, 8)
    with no_dropout():
        got = model(x)
    want = quiet.layer(x)
    want = quiet.quiet(quiet.attn(want, want, want)[0] + F.scaled_dot_product_attention(want, want, want))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_real_check_draws_what_the_reference_draws_in_one_piece():
    torch.rand(33)  # the launcher's stream is elsewhere: the rank and the reference start from the plan's seed
    lines: list[str] = []
    cmp = run_training(str(MODELS / "label_drop.py"), Plan(), RunOptions(steps=3, check=True, timeout_s=240),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("drawn from the same seeded stream" in line for line in lines), lines
