"""The pass runner: runs in order, collects typed results, lints, names the pass that failed
(and those before it), switches a pass off by name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from graphsplit import GraphsplitError, Plan
from graphsplit.passes.manager import PassInput, PassResults, run_passes
from graphsplit.rewrite import PASSES


@dataclass(frozen=True)
class Seen:
    names: tuple[str, ...]


def graph() -> fx.GraphModule:
    return fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


INPUT = PassInput(Plan(), (torch.randn(1, 2),))


def recorder(name):
    def run(gm, inp, done):
        before = done.get(Seen)
        return gm, Seen((*(before.names if before else ()), name))
    return run


def test_passes_run_in_order_and_each_sees_the_results_before_it():
    run = run_passes(graph(), INPUT, [("a", recorder("a")), ("b", lambda gm, i, d: (gm, None)), ("c", recorder("c"))])
    assert [r.names for r in run.results.found] == [("a",), ("a", "c")]
    assert run.results.get(Seen).names == ("a",)  # the first of a type
    assert list(run.timings) == ["a", "b", "c"]


def test_a_pass_switched_off_by_name_does_not_run():
    run = run_passes(graph(), INPUT, [("a", recorder("a")), ("c", recorder("c"))], disabled=frozenset({"a"}))
    assert run.results.get(Seen).names == ("c",) and list(run.timings) == ["c"]
    with pytest.raises(GraphsplitError, match="no pass is called b; the passes are a, c"):
        run_passes(graph(), INPUT, [("a", recorder("a")), ("c", recorder("c"))], disabled=frozenset({"b"}))


def test_a_failing_pass_is_named_with_the_passes_before_it():
    def broken(gm, inp, done):
        raise KeyError("x")

    with pytest.raises(GraphsplitError, match=r"pass broken failed \(after a\): KeyError"):
        run_passes(graph(), INPUT, [("a", recorder("a")), ("broken", broken)])
    with pytest.raises(GraphsplitError, match="pass b returned str, not a GraphModule"):
        run_passes(graph(), INPUT, [("b", lambda gm, i, d: ("gm", None))])


def test_the_graph_is_linted_after_each_pass_that_moves_nodes_and_after_the_last():
    def dangling(gm, inp, done):
        relu = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "1")
        relu.args = (fx.Node(gm.graph, "ghost", "placeholder", "ghost", (), {}),)
        return gm, None

    def adds_a_dangling_node(gm, inp, done):
        relu = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "1")
        with gm.graph.inserting_after(relu):
            gm.graph.call_function(torch.relu, (fx.Node(gm.graph, "ghost", "placeholder", "ghost", (), {}),))
        return gm, None

    with pytest.raises(GraphsplitError, match="pass dangling failed"):
        run_passes(graph(), INPUT, [("dangling", dangling)])
    # a pass that adds a node is checked at once; one that only rewires, by the last pass's check
    with pytest.raises(GraphsplitError, match="pass adds_a_dangling_node failed"):
        run_passes(graph(), INPUT, [("adds_a_dangling_node", adds_a_dangling_node), ("a", recorder("a"))])
    with pytest.raises(GraphsplitError, match=r"pass a failed \(after dangling\)"):
        run_passes(graph(), INPUT, [("dangling", dangling), ("a", recorder("a"))])


def test_the_compiler_lists_every_pass_once():
    names = [name for name, _ in PASSES]
    assert names == ["grad_mode", "token_mean", "sync_batch_norm", "expert_parallel", "tensor_parallel",
                     "vocab_parallel_loss", "float8", "autocast", "float8_gather", "async_tp", "context_parallel", "pipeline_split", "checkpoint"]
    assert isinstance(PassResults().adding(None), PassResults)
