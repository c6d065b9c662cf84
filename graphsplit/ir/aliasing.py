"""Which values of a graph share storage, and which storages an op writes in place.

Two questions need it. A value whose storage is written in place must be computed exactly
once, where the writes land: a stage that recomputed it for itself (analysis/recompute.py)
would write into a fresh copy, and a reader after the cut would miss the writes made before it
(FEDformer fills a complex zeros tensor mode by mode; a cut inside that loop lost half the
modes). And a view must stay a view where its storage is written (export_views.py).

aten ops say both in their schema (`alias_info`). Graphs torch.fx traces hold Python
spellings instead: `operator.setitem`, methods ending in `_`, `inplace=True`, and views by
name. Where nothing says, an op is taken to return fresh storage: the analysis errs towards
recomputing, and the schema-less ops that alias (`getitem`, views) are named below.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx as fx
import torch.nn as nn

from .op_kinds import MATRIX_TRANSPOSES, RESHAPES, SPLITS, TRANSPOSES, OpKind, family, op_name

# ops (by name, every spelling) whose output may share its first input's storage
_VIEW_NAMES = frozenset({
    *RESHAPES, *TRANSPOSES, *SPLITS, *MATRIX_TRANSPOSES, "movedim", "moveaxis", "expand", "expand_as", "select",
    "slice", "narrow", "diagonal", "as_strided", "view_as_real", "view_as_complex", "real", "imag", "unfold",
    "contiguous", "to", "type_as", "float", "half", "bfloat16", "double", "detach", "alias", "data", "T", "H", "mH", "getitem",
    "__getitem__",
})
# `x[i] = v`, `x += v` (on a tensor, `+=` writes into x)
_IN_PLACE_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                 operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                                 operator.ixor, operator.ilshift, operator.irshift, operator.imatmul})
_FAMILIES_THAT_VIEW = (OpKind.VIEW, OpKind.TRANSPOSE, OpKind.SPLIT, OpKind.EXPAND, OpKind.GETITEM)


class Storages:
    """Union-find over a graph's nodes: one class per storage its values may share."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.parent: dict[fx.Node, fx.Node] = {}
        writes = {node: written_inputs(node, gm) for node in gm.graph.nodes}
        for node in gm.graph.nodes:
            for base in [*aliased_inputs(node, gm), *writes[node]]:  # an in-place op returns what it wrote
                self._union(node, base)
        self.written = {self.find(n) for ns in writes.values() for n in ns}

    def find(self, node: fx.Node) -> fx.Node:
        root = node
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        while node is not root:  # path compression
            self.parent[node], node = root, self.parent.get(node, root)
        return root

    def is_written(self, node: fx.Node) -> bool:
        """Some op writes in place into storage `node`'s value may share."""
        return self.find(node) in self.written

    def _union(self, a: fx.Node, b: fx.Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb


def _schema_args(node: fx.Node) -> list[tuple[Any, Any]] | None:
    """(schema argument, the node's value for it) pairs; None when the target has no schema."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return None
    pairs = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            pairs.append((arg, node.args[i]))
        elif arg.name in node.kwargs:
            pairs.append((arg, node.kwargs[arg.name]))
    return pairs


def _nodes_in(value: Any) -> list[fx.Node]:
    out: list[fx.Node] = []
    fx.node.map_arg(value, out.append)
    return out


def _first(node: fx.Node) -> list[fx.Node]:
    return _nodes_in(node.args[0]) if node.args else []


def aliased_inputs(node: fx.Node, gm: fx.GraphModule | None = None) -> list[fx.Node]:
    """The inputs whose storage `node`'s output may share."""
    if node.op in ("placeholder", "get_attr", "output", "call_module"):
        return []
    if node.op == "call_function" and node.target is operator.getitem:
        return _nodes_in(node.args[0])  # an item of a split, or a basic index of a tensor: a view
    pairs = _schema_args(node)
    if pairs is not None:
        sets = set().union(*(r.alias_info.before_set for r in node.target._schema.returns if r.alias_info))
        return [n for arg, value in pairs if arg.alias_info and arg.alias_info.before_set & sets
                for n in _nodes_in(value)]
    if node.op == "call_function" and node.target is getattr:
        return _first(node) if len(node.args) > 1 and node.args[1] in _VIEW_NAMES else []
    if op_name(node) in _VIEW_NAMES or (gm is not None and family(node, gm) in _FAMILIES_THAT_VIEW):
        return _first(node)
    return []


def written_inputs(node: fx.Node, gm: fx.GraphModule | None = None) -> list[fx.Node]:
    """The inputs `node` writes in place."""
    if node.op in ("placeholder", "get_attr", "output"):
        return []
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target)) if gm is not None else None
        return _first(node) if isinstance(mod, nn.Module) and getattr(mod, "inplace", False) is True else []
    if node.op == "call_function" and node.target is operator.getitem:
        return []
    if node.op == "call_function" and node.target in _IN_PLACE_OPERATORS:
        return _first(node)
    pairs = _schema_args(node)
    if pairs is not None:
        return [n for arg, value in pairs if arg.alias_info and arg.alias_info.is_write for n in _nodes_in(value)]
    written = _nodes_in(node.kwargs.get("out")) if "out" in node.kwargs else []
    name = op_name(node)
    if (name.endswith("_") and not name.endswith("__")) or node.kwargs.get("inplace") is True:
        written += _first(node)
    return written


def buffer_writes_early(gm: fx.GraphModule) -> int:
    """Move each in-place write into a buffer that nothing reads after it (torch.export puts a buffer's
    update, `self.calls += 1`, at the graph's end as `copy_(buffer, new)`) to just after the last op it
    must follow: its own inputs, and every read of the buffer's storage. Same values, same order of every
    read and write of that storage; only the ops between, which do not touch it, now come after. A
    pipeline then keeps the buffer's span (reads and writes in one stage) short, not the whole model.
    How many writes moved."""
    storages = Storages(gm)
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    moved = 0
    for node in list(gm.graph.nodes):
        written = written_inputs(node, gm)
        if node.users or not written or not all(storages.find(w).op == "get_attr" for w in written):
            continue
        shared = {storages.find(w) for w in written}
        members = [n for n in gm.graph.nodes if n is not node and storages.find(n) in shared]
        after = [*node.all_input_nodes, *(u for m in members for u in m.users if u is not node), *members]
        anchor = max(after, key=order.__getitem__, default=None)
        if anchor is not None and order[anchor] + 1 < order[node] and anchor.op != "placeholder":
            anchor.append(node)
            moved += 1
    return moved
