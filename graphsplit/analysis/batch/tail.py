"""A model that pairs or couples its samples only at its end: the whole-batch tail.

CLIP's forward ends in the image x text logits (each entry pairs two samples), HF's CLIPModel also
in its contrastive loss (a softmax along the batch). Up to there every sample is computed apart: the
towers, their projections, the normalized embeddings. Cutting the batch there would train another
loss; refusing the batch would leave the towers on one replica. As open_clip's and HF's own training
code does (`gather_with_grad`), each replica computes the towers on its share and the tail on every
replica's embeddings gathered: the tail is the graph nodes downstream of the first node that pairs or
couples the batch, the gather sits on each value the tail reads that still holds one sample per row.

The tail is taken only where it is cheap to run on the whole batch on every replica and the same on
each: it reads no weight (no linear, no module with parameters, no parameter directly). Otherwise the
class is no batch, as before (a graph network couples its nodes at its first layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch.fx as fx
import torch.nn as nn

from ...ir.meta import info
from ...ir.op_kinds import OpKind, classify
from .atoms import Atoms, Label

_WEIGHT_KINDS = frozenset({OpKind.LINEAR, OpKind.CONV, OpKind.EMBEDDING, OpKind.GROUPED_LINEAR})


@dataclass(frozen=True)
class WholeTail:
    nodes: frozenset[str]  # the graph nodes that run on the whole batch
    # (node, batch dim, the tail's nodes that read it) of each per-sample value the tail reads
    gather: tuple[tuple[str, int, tuple[str, ...]], ...]
    why: str  # what pairs or couples the samples, and where


def whole_tail(gm: fx.GraphModule, atoms: Atoms, node_labels: Mapping[str, tuple[Label, ...]],
               roots: frozenset[int], skipped: frozenset[str] = frozenset()) -> WholeTail | None:
    """The tail in which the batch classes `roots` (the image and the text batch of a two-tower model,
    cut alike) are paired or coupled, where one exists (see the module docstring); None where it does
    not, or where it reads a weight or a value it cannot gather. `skipped`: nodes of repeated blocks
    the discovery answered by their twins (analysis/repeated_blocks.py): a tail among them is not
    taken, their own dims unseen."""
    roots = frozenset(atoms.find(r) for r in roots)
    if any(atoms.fixed[r] or r in atoms.routed for r in roots):
        return None
    nodes = {n.name: n for n in gm.graph.nodes}
    coupling = {name for r in roots for name, _ in atoms.mixers.get(r, []) if name}
    pairing = [name for name, labels in node_labels.items() if len(_dims_of(atoms, labels, roots)) > 1]
    seeds = [*coupling, *pairing]
    if not seeds or any(name not in nodes for name in seeds):
        return None
    tail: set[str] = set()
    stack = [nodes[name] for name in seeds]
    while stack:
        node = stack.pop()
        if node.op == "output" or node.name in tail:
            continue
        tail.add(node.name)
        stack.extend(node.users)
    if tail & skipped:
        return None
    gather: dict[str, int] = {}
    readers: dict[str, list[str]] = {}
    for name in tail:
        node = nodes[name]
        if _reads_weight(node, gm):
            return None
        for source in node.all_input_nodes:
            if source.name in tail:
                continue
            labels = node_labels.get(source.name)
            dims = _dims_of(atoms, labels, roots) if labels is not None else []
            if not dims:
                continue
            if len(dims) > 1 or len(labels[dims[0]]) != 1:  # pairs or merges the samples itself: not a row each
                return None
            made = _made_from(source, node_labels)
            if made == "sizes":  # arange(x.shape[0]) of a replica's x: gathered it would count 0.. twice
                return None
            if made == "data":  # a constant (arange(8) at the traced batch) is the whole batch's as it is
                gather[source.name] = dims[0]
                readers.setdefault(source.name, []).append(name)
    if not gather or all(nodes[name].op == "placeholder" for name in gather):
        return None  # nothing computed apart before the tail (it reads the inputs as they came): no batch
    coupled = [atoms.coupled[r] for r in sorted(roots) if r in atoms.coupled]
    if coupled:
        why = coupled[0]
    else:
        first = nodes[pairing[0]]
        where = info(first).source
        why = f"{first.name} pairs the samples" + (f" at {where}" if where is not None else "")
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return WholeTail(frozenset(tail), tuple((name, gather[name], tuple(sorted(readers[name], key=order.__getitem__)))
                                            for name in sorted(gather, key=order.__getitem__)), why)


def _made_from(node: fx.Node, node_labels: Mapping[str, tuple[Label, ...]]) -> str:
    """"data" where `node` is computed from an input's values, "sizes" where only from an input's sizes (a
    factory call sized by it), "constant" where from neither."""
    seen: set[str] = set()
    through_sizes = False
    stack: list[tuple[fx.Node, bool]] = [(node, False)]
    while stack:
        n, sized = stack.pop()
        if n.op == "placeholder":
            if not sized:
                return "data"
            through_sizes = True
        key = f"{n.name}:{sized}"
        if key in seen:
            continue
        seen.add(key)
        for source in n.all_input_nodes:
            stack.append((source, sized or source.name not in node_labels))
    return "sizes" if through_sizes else "constant"


def _dims_of(atoms: Atoms, labels: tuple[Label, ...], roots: frozenset[int]) -> list[int]:
    return [k for k, label in enumerate(labels) if any(atoms.find(a) in roots for a in label)]


def _reads_weight(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return any(True for _ in module.parameters())
    if node.op == "get_attr" or classify(node, gm) in _WEIGHT_KINDS:
        return True
    for source in node.all_input_nodes:
        if source.op == "get_attr":
            try:
                if isinstance(gm.get_parameter(str(source.target)), nn.Parameter):
                    return True
            except AttributeError:  # a buffer or a constant
                continue
    return False
