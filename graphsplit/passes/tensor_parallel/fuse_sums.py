"""One collective for row-parallel sums that are added together (parallel-residual blocks).

GPT-J, GPT-NeoX, Falcon and PaLM compute `x + attn(ln(x)) + mlp(ln(x))`: two row-parallel
layers whose partial sums Megatron reduces one by one. Summing is linear, so
`g(a) + b_attn + g(c) + b_mlp + x` is `g(a + c) + b_attn + b_mlp + x`: one all-reduce forward
(and, g being the identity backward, the same gradients). Under sequence parallelism the same
holds for the reduce-scatters of one sequence dim.

`fuse_partial_sums(gm)` runs after the walk: it reads each tree of adds whose inner adds have
no other user (so no other consumer sees a changed intermediate value), and where two or more
of its terms are the same collective of partials of one shape, it sums the partials first and
reduces once. A sequential block (`x = x + attn(..); x = x + mlp(ln(x))`) has its intermediate
sum read by the norm, so it keeps its two collectives.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from ...ir.meta import info, insert_node
from ...ir.op_kinds import OpKind
from ...ops import tp as tpops

_REDUCES = (tpops.reduce_from_tp, tpops.reduce_scatter_to_tp)


_ADDS = (operator.add, torch.add, torch.ops.aten.add.Tensor)


def _is_add(node: Any) -> bool:
    if not isinstance(node, fx.Node) or node.kwargs or len(node.args) != 2 or info(node).value != "tensor":
        return False
    if node.op == "call_function" and node.target in _ADDS:
        return all(isinstance(a, fx.Node) and info(a).value == "tensor" for a in node.args)
    return False


def _is_no_dropout(node: Any, gm: fx.GraphModule) -> bool:
    """A dropout of probability 0 (HF's `hidden_dropout=0.0` between a block's sums): the identity.
    A real dropout is not looked through: each tp rank would mask its own partial sum."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return False
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        return isinstance(mod, torch.nn.Dropout) and mod.p == 0
    if node.op == "call_function" and node.target in (F.dropout, torch.ops.aten.dropout.default):
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        return p == 0
    return False


def _terms(root: fx.Node, gm: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node]]:
    """(the terms a tree of adds sums, its inner nodes): an add operand is expanded when the tree
    is its only user, and looked through a dropout of probability 0."""
    terms, inner, todo = [], [], list(root.args)
    while todo:
        a = todo.pop(0)
        if _is_add(a) and len(a.users) == 1:
            inner.append(a)
            todo.extend(a.args)
        elif _is_no_dropout(a, gm):
            inner.append(a)
            todo.append(a.args[0])
        else:
            terms.append(a)
    return terms, inner


def _key(term: fx.Node, root: fx.Node) -> tuple[Any, ...] | None:
    """Which collective a term is, if it is one whose partials may be summed first: the same
    target, dims and communicator, partials shaped as the tree's result."""
    if term.op != "call_function" or term.target not in _REDUCES or len(term.users) != 1:
        return None
    partial = term.args[0]
    spec, want = info(partial).tensor if isinstance(partial, fx.Node) else None, info(root).tensor
    if spec is None or want is None or tuple(spec.shape) != tuple(want.shape) or spec.dtype != want.dtype:
        return None
    return (term.target, *term.args[1:])


def fuse_partial_sums(gm: fx.GraphModule) -> int:
    """Reduce once where row-parallel sums meet in adds; returns how many collectives were removed."""
    removed = 0
    erased: set[fx.Node] = set()
    for root in reversed(list(gm.graph.nodes)):
        if root in erased or not _is_add(root):
            continue
        if len(root.users) == 1 and _is_add(next(iter(root.users))):
            continue  # inside a larger tree: its root decides
        terms, inner = _terms(root, gm)
        groups: dict[tuple[Any, ...], list[fx.Node]] = defaultdict(list)
        for t in terms:
            if (key := _key(t, root)) is not None:
                groups[key].append(t)
        fusable = [g for g in groups.values() if len(g) > 1]
        if not fusable:
            continue
        rest = [t for t in terms if not any(t in g for g in fusable)]
        parts = []
        for group in fusable:
            partial = group[0].args[0]
            for other in group[1:]:
                partial = _add(gm.graph, partial, other.args[0], root, info(group[0].args[0]).sharding)
            reduced = insert_node(gm.graph, group[0].target, (partial, *group[0].args[1:]), before=root, owner=root,
                                  kind=OpKind.COLLECTIVE, tensor=info(group[0]).tensor, sharding=info(group[0]).sharding)
            parts.append(reduced)
            removed += len(group) - 1
        total = parts[0]
        for term in parts[1:] + rest:
            total = _add(gm.graph, total, term, root, info(root).sharding)
        root.replace_all_uses_with(total)
        for dead in [root, *inner, *(t for g in fusable for t in g)]:  # each user first
            gm.graph.erase_node(dead)
            erased.add(dead)
    return removed


def _add(graph: fx.Graph, a: fx.Node, b: fx.Node, root: fx.Node, layout: Any) -> fx.Node:
    return insert_node(graph, operator.add, (a, b), before=root, owner=root, kind=OpKind.OTHER,
                       tensor=info(root).tensor, sharding=layout)
