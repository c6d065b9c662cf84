"""Running a graph on meta under the discovery: which node (and model line) each ATen op belongs to, and
the dim labels of every node's output (read where a tail pairs the samples, or a sum reduces them)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx

from ...ir.cpu_stand_ins import on_cpu_stand_ins, runs_on_cpu
from ...ir.devices import meta_sizes
from ...ir.fast_meta import FastMetaPointwise
from ...ir.meta import SourceLine, info
from ..fused_attention import FusedAttention
from ..repeated_blocks import BlockSkipper, canonical, repeated_blocks
from .atoms import Label
from .mode import Discovery


class GraphRunner(fx.Interpreter):
    """Runs the graph on meta, telling the discovery which node (and model line) it is in."""

    def __init__(self, gm: fx.GraphModule, discovery: Discovery) -> None:
        super().__init__(gm)
        run = repeated_blocks(gm)
        self.skipper = BlockSkipper(run, self._canon) if run is not None else None
        self.extra_traceback = False
        self.discovery = discovery
        self.node: fx.Node | None = None
        self.labels: dict[str, tuple[Label, ...]] = {}  # node -> its output's dim labels
        self.made_by: dict[int, str] = {}  # id of a node's output tensor -> the node
        discovery.where = self.where

    def where(self) -> str:
        node = self.node
        if node is None:
            return _frame_source() or "the loss"
        if node.op == "call_module" and (inside := _frame_source()) is not None:
            return inside  # a module run as written (ir/eager_modules.py): the line in its forward
        source = info(node).source
        return str(source) if source is not None else f"node {node.name}"

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return super().call_module(target, args, kwargs)
        except Exception as exc:
            module = self.fetch_attr(str(target))
            if not runs_on_cpu(module, args, kwargs, exc):
                raise
        # a module that reads values (ir/cpu_stand_ins.py) on CPU stand-ins, each labelled as the tensor it stands
        # for; the discovery sees its ops there
        d = self.discovery

        def relabel(new: torch.Tensor, old: torch.Tensor) -> None:
            d.set(new, d.value(old).labels, d.value(old).reduced)

        return on_cpu_stand_ins(module, args, kwargs, relabel)

    def _canon(self, value: Any) -> Any:
        atoms = self.discovery.atoms

        def classes(t: torch.Tensor) -> Any:
            v = self.discovery.value(t)
            return (tuple(tuple(atoms.find(a) for a in label) for label in v.labels),
                    frozenset(atoms.find(a) for a in v.reduced))

        return canonical(value, classes)

    def run_node(self, n: fx.Node) -> Any:  # a later repeated block: block 2's values stand in
        result = self.skipper.step(n, self._run_node) if self.skipper is not None else self._run_node(n)
        if isinstance(result, torch.Tensor):  # each node's dims, read where a tail pairs the samples (tail.py)
            self.labels[n.name] = self.discovery.value(result).labels
            self.made_by[id(result)] = n.name
        elif isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result):
            self.labels[n.name] = ()  # tensors in a tuple: values, not sizes (their getitems carry the dims)
        return result

    def _run_node(self, n: fx.Node) -> Any:
        self.node = n
        self.discovery.atoms.at = n.name
        try:
            return super().run_node(n)
        finally:
            self.node = None
            self.discovery.atoms.at = ""


def _frame_source() -> str | None:
    from ...ir.user_source import internal

    frame = sys._getframe(2)
    while frame is not None:
        if not internal(frame.f_code.co_filename):
            return str(SourceLine(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return None


@contextlib.contextmanager
def discovering(d: Discovery) -> Iterator[None]:
    """`with discovering(d):` ops run on meta under the discovery `d`, as the analysis runs them: attention
    one op, at once; plain pointwise ops answered below the discovery, which still sees every op."""
    with torch.enable_grad(), FastMetaPointwise(), d, meta_sizes(), FusedAttention(on_meta=True):
        yield
