"""Make an exported graph independent of the strides its kernels happened to return.

torch.export runs the model once, on the trace device's kernels, and records what ran: a
`.contiguous()` on a tensor that was contiguous there records nothing (it returned its input), so
a later `.view()` relies on that layout. Another kernel (SDPA on `meta`, where the analysis runs,
or on another GPU) returns other strides for the same op, and the view fails there although the
model itself would have copied first. Inductor meets the same problem after functionalization and
turns every view into a reshape (torch/_inductor/fx_passes/post_grad.py, `view_to_reshape`).

`reshape` is a view whenever a view is possible and a copy only where the view would raise, so
the rewrite changes nothing where the traced graph ran; it differs only where a copy breaks an
alias the program relies on: a value written in place (the schema's `alias_info.is_write`) while
it shares storage with the view. Such views are kept as views: on a device where their layout is
not viewable they fail loudly instead of computing on a copy that misses the write.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten


def views_to_reshapes(gm: fx.GraphModule) -> int:
    """Rewrite each `aten.view.default` whose storage nothing writes in place into
    `aten.reshape.default`; return how many were rewritten."""
    storage = _Storages()
    for node in gm.graph.nodes:
        for base in _aliased_inputs(node):
            storage.union(node, base)
    written = {storage.find(n) for node in gm.graph.nodes for n in _written_inputs(node)}
    count = 0
    for node in gm.graph.find_nodes(op="call_function", target=aten.view.default):
        if storage.find(node) not in written:
            node.target = aten.reshape.default
            count += 1
    if count:
        gm.recompile()
    return count


class _Storages:
    """Union-find over nodes: one class per storage the graph's values may share."""

    def __init__(self) -> None:
        self.parent: dict[fx.Node, fx.Node] = {}

    def find(self, node: fx.Node) -> fx.Node:
        root = node
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        while node is not root:  # path compression
            self.parent[node], node = root, self.parent.get(node, root)
        return root

    def union(self, a: fx.Node, b: fx.Node) -> None:
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


def _aliased_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs whose storage `node`'s output may share."""
    if node.op in ("placeholder", "get_attr", "output"):
        return []
    if node.op == "call_function" and node.target is operator.getitem:
        return _nodes_in(node.args[0])  # an item of a multi-output op (split) shares its storage
    pairs = _schema_args(node)
    if pairs is None:  # no schema to read: assume the worst
        return node.all_input_nodes
    sets = set().union(*(r.alias_info.before_set for r in node.target._schema.returns if r.alias_info))
    return [n for arg, value in pairs if arg.alias_info and arg.alias_info.before_set & sets
            for n in _nodes_in(value)]


def _written_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs `node` writes in place."""
    if node.op in ("placeholder", "get_attr", "output"):
        return []
    if node.op == "call_function" and node.target is operator.getitem:
        return []
    pairs = _schema_args(node)
    if pairs is None:  # no schema to read: assume the worst
        return node.all_input_nodes
    return [n for arg, value in pairs if arg.alias_info and arg.alias_info.is_write for n in _nodes_in(value)]
