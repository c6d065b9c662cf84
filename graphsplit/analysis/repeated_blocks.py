"""Analyses over repeated blocks: the third block's results stand for every later one's.

An 80-layer transformer runs the same ops 80 times, and the meta analyses (batch discovery, shapes and
FLOPs) spend most of their time there. The blocks are exact repeats (ir/repeats.py: same ops on the
same relative arguments), so where what block 2 hands on is what block 1 handed it, as the analysis
sees values (batch discovery: shapes, dtypes and dim-label classes, the residual stream [batch,
sequence, hidden] in and the same out; the shape analysis: shapes, dtypes, whether each needs a
gradient), block 3 would find what block 2 found, and so would every later block: a fixed point. Then
blocks 3.. are not run: each value a later block or the tail reads from block k is block 2's at the
same place, and each of their nodes is answered by its twin in block 2. Checked on the values before
skipping (`canon`); otherwise every block runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ..ir.repeats import find_fold


@dataclass(frozen=True)
class BlockRun:
    blocks: tuple[tuple[fx.Node, ...], ...]  # each repeated block's ops, in order
    reads: tuple[int, ...]  # the places in a block the next block reads
    tail_reads: tuple[int, ...]  # the places in the last block the rest of the graph reads


def repeated_blocks(gm: fx.GraphModule) -> BlockRun | None:
    """The run of repeated blocks whose values reach only the next block (the last one's: anything), or
    None: no run, or a block read from elsewhere (a model returning every layer's hidden states)."""
    found = find_fold(gm)
    if found is None:
        return None
    blocks = tuple(tuple(b) for b in found[3])
    if len(blocks) < 4:
        return None
    sets = [set(b) for b in blocks]

    def read_from(k: int) -> tuple[int, ...]:
        """The places in block k that nodes outside it read."""
        place = {op: i for i, op in enumerate(blocks[k])}
        return tuple(sorted({place[a] for user in {u for op in blocks[k] for u in op.users if u not in sets[k]}
                             for a in user.all_input_nodes if a in place}))

    reads = read_from(1)
    for k in range(1, len(blocks) - 1):
        if any(u not in sets[k + 1] for op in blocks[k] for u in op.users if u not in sets[k]):
            return None  # read by something beside the next block
        if read_from(k) != reads:
            return None
    return BlockRun(blocks, reads, read_from(len(blocks) - 1))


class BlockSkipper:
    """Decides, when block 3 is about to run, whether blocks 3.. can be skipped; then answers their
    nodes (see the module docstring). `canon(value)`: a value's shape, dtype and label classes."""

    def __init__(self, run: BlockRun, canon: Callable[[Any], Any]) -> None:
        self.run = run
        self.canon = canon
        self.watch = {op: (k, i) for k in (1, 2) for i, op in enumerate(run.blocks[k])
                      if i in run.reads or (k == 2 and i in run.tail_reads)}
        self.kept: dict[tuple[int, int], Any] = {}
        self.start = run.blocks[3][0]
        self.stand_in: dict[fx.Node, tuple[int, int]] = {}
        self.skipped: set[fx.Node] = set()
        self.twins: dict[fx.Node, fx.Node] = {}  # a skipped node -> block 2's node at its place

    def step(self, node: fx.Node, run: Callable[[fx.Node], Any],
             answer: Callable[[fx.Node, fx.Node], None] | None = None) -> Any:
        """`run(node)`, watched; for a skipped node instead `answer(node, its twin)` and the stand-in value."""
        if self.skips(node):
            if answer is not None:
                answer(node, self.twin(node))
            return self.value(node)
        value = run(node)
        self.seen(node, value)
        return value

    def seen(self, node: fx.Node, value: Any) -> None:
        place = self.watch.get(node)
        if place is not None:
            self.kept[place] = value

    def skips(self, node: fx.Node) -> bool:
        if node is self.start:
            self._decide()
        return node in self.skipped

    def value(self, node: fx.Node) -> Any:
        place = self.stand_in.get(node)
        return self.kept[place] if place is not None else None

    def _decide(self) -> None:
        run = self.run
        if not all(self.canon(self.kept[1, i]) == self.canon(self.kept[2, i]) for i in run.reads):
            return
        for k in range(3, len(run.blocks)):
            self.skipped.update(run.blocks[k])
            self.twins.update(zip(run.blocks[k], run.blocks[2]))
            places = run.tail_reads if k == len(run.blocks) - 1 else run.reads
            self.stand_in.update({run.blocks[k][i]: (2, i) for i in places})

    def twin(self, node: fx.Node) -> fx.Node:
        """Block 2's node at the place of a skipped `node`."""
        return self.twins[node]

    def same_place(self, name: str) -> list[str]:
        """The names of the skipped nodes at the place of block 2's node `name` (none elsewhere)."""
        second = {op.name: i for i, op in enumerate(self.run.blocks[2])}
        if name not in second or not self.skipped:
            return []
        return [block[second[name]].name for block in self.run.blocks[3:]]


def canonical(value: Any, labels: Callable[[torch.Tensor], Any]) -> Any:
    """A value as the skipping compares it: tensors by shape, dtype and `labels`, containers by their
    items, anything else as it is."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, labels(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(canonical(v, labels) for v in value))
    return value
