"""The meta analyses over repeated blocks (analysis/repeated_blocks.py): where block 2 hands on what
block 1 handed it (batch discovery: the same label classes; the shape analysis: the same shapes), blocks
3.. are not run and block 2's values and annotations stand in; what is found is what running every
block finds, and a run of blocks that is no fixed point runs whole."""

import dataclasses

import torch
import torch.nn as nn

import graphsplit.analysis.batch.runner as runner
import graphsplit.analysis.shapes as shapes
from graphsplit.analysis.repeated_blocks import BlockSkipper, repeated_blocks
from graphsplit.ir.meta import info
from graphsplit.ir.trace import trace_model
from graphsplit.loader import load_model
from graphsplit.rewrite import find_batch, trace_loaded

from .conftest import ROOT


class _Recording(runner.BlockSkipper):
    made: list["_Recording"] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Recording.made.append(self)


def _both(monkeypatch, traced, flat, loss_fn=None, target=None):
    _Recording.made.clear()
    monkeypatch.setattr(runner, "BlockSkipper", _Recording)
    folded = find_batch(traced, flat, loss_fn, target)
    skipped = [len(s.skipped) for s in _Recording.made]
    monkeypatch.setattr(runner, "repeated_blocks", lambda gm: None)
    whole = find_batch(traced, flat, loss_fn, target)
    return folded, whole, skipped


def test_later_blocks_of_a_transformer_are_not_run_and_the_batch_is_the_same(monkeypatch):
    loaded = load_model(str(ROOT / "examples" / "llama.py"))
    build = loaded.builder
    loaded = dataclasses.replace(loaded, builder=lambda: build(n_layers=8))
    traced = trace_loaded(loaded)
    flat = traced.flatten_inputs(loaded.args, loaded.kwargs)
    folded, whole, skipped = _both(monkeypatch, traced, flat, loaded.loss_fn, loaded.target)
    assert skipped and skipped[0] > 0  # blocks 3..7 answered by block 2's values
    names = traced.input_names
    assert folded.to_dict(names) == whole.to_dict(names)
    assert folded.sequence is not None and whole.sequence is not None
    assert (folded.sequence.inputs, folded.sequence.outputs) == (whole.sequence.inputs, whole.sequence.outputs)


class _Turn(nn.Module):
    """Mixes its last dim, then turns the value: each block hands the next the dims in the other order."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(6, 6)

    def forward(self, x):
        return self.mix(x).transpose(1, 2)


class _Turning(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Turn() for _ in range(6)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_blocks_that_are_no_fixed_point_all_run(monkeypatch):
    model, x = _Turning(), torch.randn(4, 6, 6)
    traced = trace_model(model, (x,), {})
    flat = traced.flatten_inputs((x,), {})
    folded, whole, skipped = _both(monkeypatch, traced, flat)
    assert skipped == [0]
    assert folded.to_dict(traced.input_names) == whole.to_dict(traced.input_names)
    assert folded.inputs == {"x": 0}


def test_the_shape_analysis_answers_later_blocks_by_their_twins(monkeypatch):
    """The shape and FLOP analysis (analysis/shapes.py) skips blocks 3.. of the Llama example where the
    blocks hand on the same shapes: every node's annotation equals the one running every block."""
    loaded = load_model(str(ROOT / "examples" / "llama.py"))
    build = loaded.builder
    loaded = dataclasses.replace(loaded, builder=lambda: build(n_layers=8))
    traced = trace_loaded(loaded)
    inputs = tuple(torch.as_tensor(t) for t in traced.flatten_inputs(loaded.args, loaded.kwargs))
    made: list[BlockSkipper] = []
    skipper = shapes._block_skipper
    monkeypatch.setattr(shapes, "_block_skipper", lambda gm: made.append(skipper(gm)) or made[-1])
    folded = traced.copy().gm
    shapes.annotate(folded, inputs)
    monkeypatch.setattr(shapes, "_block_skipper", lambda gm: None)
    whole = traced.copy().gm
    shapes.annotate(whole, inputs)
    assert made and made[0] is not None and len(made[0].skipped) > 0
    fields = ("kind", "value", "tensor", "flops", "sizes_follow_data", "param_bytes", "bytes_moved", "module")
    assert [[getattr(info(n), f) for f in fields] for n in folded.graph.nodes] == \
        [[getattr(info(n), f) for f in fields] for n in whole.graph.nodes]


def test_a_sequentials_children_are_not_repeated_blocks():
    """An nn.Sequential's conv, norm and activation are called one after another like blocks of a run,
    each one module call: they repeat only if the modules are alike (class, settings, parameter shapes).
    Taken as repeats, the analyses answered GoogLeNet's conv by a norm's shapes."""
    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Sequential(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                   nn.BatchNorm2d(32), nn.ReLU())

        def forward(self, x):
            return self.b(x)

    assert repeated_blocks(torch.fx.symbolic_trace(Branch())) is None
    alike = nn.Sequential(*[nn.Linear(8, 8) for _ in range(5)])
    assert repeated_blocks(torch.fx.symbolic_trace(alike)) is not None
