"""Which sums of a graph add the samples up: a loss summed over the batch, where cutting the batch makes
each piece's loss a share to add, not a mean to average (ir/reductions.py says what sums; the dim
labels of the discovery say whether what it sums holds the batch).

A sum reduces the batch when the value it sums holds the batch's dim (merged with others or not), or
holds elements picked from rows that do (`loss.masked_select(mask).sum()`), and its output does not.
A sum of values the batch was already reduced out of (`torch.stack([a.mean(), b.mean()]).sum()`) adds
no samples up: it is not one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ...ir.op_kinds import OpKind, family, op_name
from ...ir.reductions import summed_value
from .atoms import Label
from .chunks import lineage, settle
from .mode import Discovery
from .rules import RULES, pointwise
from .runner import GraphRunner, discovering

# ops whose output's elements are their first input's, one for one or picked (a boolean mask's selection)
_KEEPS = frozenset({OpKind.POINTWISE, OpKind.IDENTITY, OpKind.VIEW, OpKind.TRANSPOSE, OpKind.GETITEM, OpKind.EXPAND,
                    OpKind.SLICE, OpKind.CAT})
_PICKS = frozenset({"masked_select", "index", "_unsafe_index", "take", "index_select", "gather", "take_along_dim"})


def batch_sums(gm: fx.GraphModule, labels: Mapping[str, Sequence[Label]], holds: Callable[[Label], bool]) -> tuple[str, ...]:
    """The nodes of `gm` that sum the batch away, unnormalized. `labels`: each node's output's dim labels
    (the discovery's); `holds(label)`: whether a dim holds the batch."""
    memo: dict[str, bool] = {}

    def held(label_list: Sequence[Label] | None) -> bool:
        return label_list is not None and any(holds(lab) for lab in label_list)

    def rows(n: fx.Node) -> bool:  # n holds the batch, or elements picked from values that do
        if n.name not in memo:
            memo[n.name] = False
            found = held(labels.get(n.name))
            if not found and n.op in ("call_function", "call_method") and labels.get(n.name) is not None:
                if op_name(n) in _PICKS or family(n, gm) in _KEEPS:
                    found = any(rows(a) for a in n.all_input_nodes)
            memo[n.name] = found
        return memo[n.name]

    found = []
    for node in gm.graph.nodes:
        value = summed_value(node, gm)
        if value is not None and not held(labels.get(node.name)) and rows(value):
            found.append(node.name)
    return tuple(found)


def loss_batch_sums(loss_gm: fx.GraphModule, values: Sequence[Any], dims: Sequence[Sequence[int | None]]) -> tuple[str, ...]:
    """`batch_sums` of a loss graph (the user's loss_fn, traced): its placeholders' `values` (on meta)
    labelled with one batch at `dims` (per placeholder, per tensor leaf: the batch dim or None), the
    graph run once under the discovery."""
    d = Discovery(RULES, pointwise)
    runner = GraphRunner(loss_gm, d)
    batch: list[int] = []
    with discovering(d):
        for value, leaf_dims in zip(values, dims):
            leaves = [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
            for t, k in zip(leaves, leaf_dims):
                atoms = d.label_input(t)
                if k is not None and -t.dim() <= k < t.dim() and atoms[k] >= 0:
                    batch.append(atoms[k])
        for a in batch[1:]:
            d.atoms.union(batch[0], a)
        if not batch:
            return ()
        runner.run(*values)
    settle(d)
    root = d.atoms.find(batch[0])
    atoms_of = lineage(d)

    def holds(label: Label) -> bool:
        return any(d.atoms.find(a) == root for a in atoms_of(label))

    return batch_sums(loss_gm, runner.labels, holds)
