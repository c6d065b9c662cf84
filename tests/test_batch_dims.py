"""The batch is found in the graph, not assumed to be dim 0 (analysis/batch/): seq-first
models are cut along dim 1, inputs without a batch go whole to every piece, a graph whose nodes
are coupled has no batch, a model file may say it (`batch_dims()`), and the program computes what
the untouched model computes on the whole batch."""

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from graphsplit import Plan
from graphsplit.errors import GraphsplitError
from graphsplit.launch.parity import check_locally
from graphsplit.loader import LoadedModel, load_model
from graphsplit.rewrite import rewrite_loaded, rewrite_program

from .conftest import MODELS


def _found(model: nn.Module, *inputs: torch.Tensor) -> dict:
    program = rewrite_program(model, inputs, {}, Plan()).program
    return program.batch.inputs


def test_a_seq_first_transformer_is_cut_along_dim_1_and_equals_the_whole_batch():
    loaded = load_model(str(MODELS / "seq_first.py"))
    for plan in (Plan(pp=2), Plan(dp=2), Plan(pp=2, dp=2, microbatches=1)):
        program, cmp = check_locally(loaded, plan)
        assert program.batch.inputs == {"src": 1} and program.batch.target == (1,), program.batch
        assert cmp.ok, (plan, cmp.failures)
    assert program.batch.describe(program.traced.input_names) == "src dim 1 (found in the graph)"


def test_a_declared_batch_dim_the_model_mixes_is_refused_naming_the_op():
    loaded = load_model(str(MODELS / "seq_first.py"))
    loaded.batch_dims = {"src": 0}
    with pytest.raises(GraphsplitError) as exc:
        rewrite_loaded(loaded, Plan(pp=2))
    message = str(exc.value)
    assert message.startswith("batch_dims() cuts 'src' along dim 0, but the model does not keep the examples of "
                              "that dim apart:"), message
    assert "\n" not in message
    loaded.batch_dims = {"src": 1}
    program = rewrite_loaded(loaded, Plan(pp=2)).program
    assert program.batch.how == "batch_dims()" and program.batch.inputs == {"src": 1}
    loaded.batch_dims = {"source": 1}
    with pytest.raises(GraphsplitError, match="batch_dims\\(\\) names 'source', which the model takes no tensor as"):
        rewrite_loaded(loaded, Plan(pp=2))


def test_position_ids_without_a_batch_go_whole_to_every_micro_batch_and_replica():
    loaded = load_model(str(MODELS / "unbatched_ids.py"))
    for plan in (Plan(pp=2), Plan(dp=2), Plan(pp=2, dp=2, microbatches=2)):
        program, cmp = check_locally(loaded, plan)
        assert program.batch.inputs == {"x": 0, "ids": None}
        assert cmp.ok, (plan, cmp.failures)
    assert program.batch.describe(["x", "ids"]) == "x dim 0, ids whole (found in the graph)"


def test_a_graph_whose_nodes_attend_to_each_other_has_no_batch():
    """pytorch/examples' GAT: the nodes are coupled (softmax over neighbours). One micro-batch through
    the pipeline; dp replicas refused in one line that says why."""
    loaded = load_model(str(MODELS / "outside" / "gat_tiny.py"))
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert not program.batch.batched and program.plan.num_microbatches == 1
    assert cmp.ok, cmp.failures
    with pytest.raises(GraphsplitError) as exc:
        rewrite_loaded(loaded, Plan(dp=2))
    message = str(exc.value)
    assert "cannot be cut into 2 replica(s) x 1 micro-batch(es): no batch: dim 0 of 'input_tensor': _softmax along " \
           "it at main.py:" in message and "\n" not in message


def test_the_batch_is_told_apart_from_a_sequence_of_the_same_size():
    """Batch 4 and sequence 4: the labels follow dims, not sizes."""

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(x).split(8, dim=-1)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v).sum(-1)

    assert _found(Attn(), torch.randn(4, 4, 8)) == {"x": 0}


def test_what_couples_the_batch_is_named():
    class Centred(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            h = self.lin(x)
            return h - h.mean(dim=0)  # every example minus the batch's mean

    # the coupling is the model's last, weightless ops: the linear keeps the examples apart and is cut;
    # the tail runs on the whole batch, its input gathered over the replicas (analysis/batch/tail.py)
    program = rewrite_program(Centred(), (torch.randn(4, 6),), {}, Plan()).program
    assert program.batch.inputs == {"x": 0} and program.batch.outputs == (None,)
    assert [(name, dim) for name, dim, _ in program.batch.gather] == [("lin", 0)]
    assert any("mean over it at" in n for n in program.batch.notes), program.batch.notes

    class CentredThenMixed(nn.Module):  # a weight after the coupling: no tail to run whole, no batch
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)
            self.out = nn.Linear(6, 6)

        def forward(self, x):
            h = self.lin(x)
            return self.out(h - h.mean(dim=0))

    program = rewrite_program(CentredThenMixed(), (torch.randn(4, 6),), {}, Plan()).program
    assert not program.batch.batched
    assert any("mean over it at" in n for n in program.batch.notes), program.batch.notes

    class Stats(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(6)

        def forward(self, x):
            return self.bn(x)

    program = rewrite_program(Stats(), (torch.randn(4, 6),), {}, Plan()).program
    assert program.batch.inputs == {"x": 0}  # its statistics are the user's semantics (the check names them)


def test_a_batch_sorted_against_itself_is_assumed_routing_and_the_check_says_it_differs():
    """Sorting rows is how a mixture of experts routes tokens: taken as the batch, with a note; here
    the examples really are mixed, and the check against the whole batch fails."""
    loaded = load_model(str(MODELS / "sorted_batch.py"))
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert program.batch.inputs == {"x": 0}
    assert any("sorted along it at sorted_batch.py:18" in n for n in program.batch.notes), program.batch.notes
    assert not cmp.ok and any(f.split(": ", 1)[-1].startswith("loss:") or f.startswith("loss:") for f in cmp.failures), cmp.failures


def test_a_mixture_of_experts_batch_is_found_through_its_routing():
    loaded = load_model(str(MODELS / "hf_mixtral.py"))
    program = rewrite_loaded(loaded, Plan(pp=2)).program
    assert program.batch.inputs == {"input_ids": 0}
    assert any("taken to route each example" in n for n in program.batch.notes), program.batch.notes


def test_flux_position_ids_have_no_batch_dim():
    """diffusers' FluxTransformer2DModel takes img_ids and txt_ids as [tokens, 3], shared by the batch
    (tests/test_zoo.py checks it at pp 2, tp 2 and dp 2 x pp 2 x tp 2 against the whole batch)."""
    pytest.importorskip("diffusers")
    from .models import zoo

    program = rewrite_loaded(zoo.loaded(zoo.BY_NAME["Flux"]), Plan(pp=2)).program
    assert program.batch.inputs == {"hidden_states": 0, "encoder_hidden_states": 0, "pooled_projections": 0,
                                    "timestep": 0, "img_ids": None, "txt_ids": None}


def _mixers(path):
    """Every (graph node, why) that mixes each dim of each input, and whether a buffer fixes it."""
    from graphsplit.analysis.batch import discover

    from .conftest import traced_once

    loaded, traced = traced_once(path)
    flat = traced.flatten_inputs(loaded.args, loaded.kwargs)

    def loss(raw, target):
        return loaded.loss_fn(traced.unflatten_output(raw), target)

    found = discover(traced.gm, traced.input_names, flat, lambda raw: list(raw) if isinstance(raw, tuple | list) else [raw],
                     loss, loaded.target)
    return traced.gm, found.mixers


def test_the_nodes_that_mix_the_sequence_are_named():
    """What context parallelism will read: the Llama example's tokens are mixed across the sequence
    only inside its attention calls (SDPA, 4 layers) and line up with its RoPE tables; the GPT
    example's by the matmuls and softmax of its hand-written attention, the token dim by nothing."""
    from .conftest import EXAMPLES

    gm, mixers = _mixers(EXAMPLES / "llama.py")
    (batch, sequence) = mixers["idx"]
    assert batch == ((), False)
    nodes = {n.name: n for n in gm.graph.nodes}
    by, fixed = sequence
    assert fixed and by, sequence
    assert {nodes[name].target for name, _ in by} == {torch.nn.functional.scaled_dot_product_attention}
    assert len({name for name, _ in by}) == 4

    gm, mixers = _mixers(EXAMPLES / "gpt.py")
    by, fixed = mixers["idx"][1]
    assert fixed and mixers["idx"][0] == ((), False)
    targets = {str(getattr(nodes_t, "__name__", nodes_t)) for nodes_t in
               ({n.name: n for n in gm.graph.nodes}[name].target for name, _ in by)}
    assert "scaled_dot_product_attention" not in targets and {"matmul", "softmax"} <= targets, targets


@pytest.mark.parametrize("plan", [Plan(pp=2), Plan(dp=2, pp=2)], ids=["pp2", "dp2-pp2"])
def test_batched_ops_that_keep_examples_apart_keep_the_batch(plan):
    """cdist between each example's points and its own prototypes, a loss scattering each example's target
    into its own row: the batch is found through both (each was taken as mixing it: one micro-batch)."""
    loaded = load_model(str(MODELS / "batched_ops.py"))
    program, cmp = check_locally(loaded, plan)
    assert cmp.ok, cmp.failures
    assert program.batch.inputs == {"x": 0} and program.batch.target == (0,)
    assert program.plan.num_microbatches == 2 and not program.batch.notes


class _TiledMarks(nn.Module):
    """Time-Series-Library's TimeMixer, channel-independent: the series laid out sample by sample and
    channel by channel (`permute` then `reshape(B * N, T, 1)`), the time marks tiled over the batch
    (`x_mark.repeat(N, 1, 1)`), so row b * N + n meets the marks of another sample."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 4)

    def forward(self, x, marks):
        b, t, n = x.shape
        rows = x.permute(0, 2, 1).reshape(b * n, t, 1)
        return self.proj(torch.cat([rows, marks.repeat(n, 1, 1)], dim=-1))


def test_a_batch_tiled_against_another_layout_is_coupled():
    """`repeat` tiles the marks (row r * B + b is sample b's): against rows laid out sample by sample
    (b * N + n) they pair samples with channels, so dim 0 is not cut; the time steps, which nothing
    mixes here, are."""
    x, marks = torch.randn(4, 6, 3), torch.randn(4, 6, 2)
    program = rewrite_program(_TiledMarks(), (x, marks), {}, Plan(dp=2)).program
    assert program.batch.inputs == {"x": 1, "marks": 1}, program.batch


def test_a_model_that_runs_whole_but_not_on_a_piece_says_so_in_one_line():
    """With as many channels as samples the two layouts line up by size, and the batch found is not the
    one the marks are tiled by (TimeMixer in Time-Series-Library's tiny configuration): the piece fails
    on a shape, and graphsplit says which input went whole beside the cut ones."""
    x, marks = torch.randn(4, 6, 4), torch.randn(4, 6, 2)
    with pytest.raises(GraphsplitError) as exc:
        rewrite_program(_TiledMarks(), (x, marks), {}, Plan(pp=2, dp=2))
    message = str(exc.value)
    assert message.startswith("the model runs on the whole batch but not on 1/4 of it: "), message
    assert "make example_inputs()" not in message and "\n" not in message


class _RoutedWithASizeInput(nn.Module):
    """The samples reordered by a value and put back (a router's sort), beside an input only its size is
    read from (Time-Series-Library's decoder input, `zeros` of its shape)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 5)

    def forward(self, x, dec):
        order = x[:, 0].argsort()
        routed = self.proj(x[order])[order.argsort()]
        return routed + routed.new_zeros(dec.shape[0], 5)


def test_an_input_only_sized_casts_no_vote_for_the_batch():
    """Its dims are untouched by any op, so never coupled; it once outvoted the routed batch, and the
    model's real input went whole to every piece beside a cut `dec` (ETSformer: 9% off at pp 2)."""
    x, dec = torch.randn(8, 5), torch.randn(8, 3)
    program = rewrite_program(_RoutedWithASizeInput(), (x, dec), {}, Plan(pp=1, dp=2)).program
    assert program.batch.inputs == {"x": 0, "dec": 0}, program.batch


class _CircularConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1, padding_mode="circular")  # Time-Series-Library's TokenEmbedding

    def forward(self, x):  # [batch, time, channels]
        return self.conv(x.permute(0, 2, 1)).transpose(1, 2)


def test_a_dim_written_into_a_padded_tensor_is_mixed_where_the_padded_one_is():
    """Circular padding copies x into a slice of a bigger tensor (`empty`, then `copy_` into its middle
    and ends) that the convolution mixes: x's time steps are mixed too, not independent examples."""
    model, x = _CircularConv(), torch.randn(4, 12, 4)
    with pytest.raises(GraphsplitError, match="cuts 'x' along dim 1, but the model does not keep the examples of that "
                                              "dim apart: written into part of a dim that is mixed"):
        rewrite_program(model, (x,), {}, Plan(dp=2), declared_batch={"x": 1})
    assert rewrite_program(model, (x,), {}, Plan(dp=2)).program.batch.inputs == {"x": 0}


class _RepeatedAndUnfolded(nn.Module):
    """A per-sample statistic repeated along time (`repeat(1, T)`, SCINet, TiDE) and patches cut with
    `Tensor.unfold` (PAttn, TimeXer): both keep each sample's rows apart."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(2, 4)

    def forward(self, x):  # [batch, channels, time]
        centred = x - x.mean(2).repeat(1, 1).unsqueeze(-1).repeat(1, 1, x.shape[-1])
        return self.patch(centred.unfold(-1, 2, 2))


def test_repeats_of_one_and_unfolded_patches_keep_the_batch():
    model, x = _RepeatedAndUnfolded(), torch.randn(8, 3, 6)
    assert _found(model, x) == {"x": 0}
    loaded = LoadedModel(Path(__file__), "_RepeatedAndUnfolded", _RepeatedAndUnfolded, (x,), {}, None, None)
    _, cmp = check_locally(loaded, Plan(dp=2))
    assert cmp.ok, cmp.failures
