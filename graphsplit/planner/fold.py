"""Fold a deep model's repeated blocks, so the planner compiles two of them instead of all.

A transformer of L identical blocks traces to a head (embedding...), L blocks
that each read the previous one's output and the head's shared values (a mask,
rotary tables), and a tail (final norm, LM head). `fold` keeps the head, the
first two blocks and the tail: the second block stands for every later one (it
reads a block's outputs and the shared values exactly as they do), and the tail
reads the second block's outputs in place of the last one's. Compiling that small
graph (tensor parallel, autocast...) and measuring it gives every number of the
whole graph: `Fold.unfold_index` maps the compiled folded ops back to positions in
the whole sequence (head, block 0, blocks 1..L-1 as copies of the second, tail).

Only exact repeats fold: every block after the first must have the same ops, on
the same relative arguments, as the second (checked op by op); anything else is
left whole.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from ..ir.meta import block_of, info, module_path
from ..ir.repeats import MIN_BLOCKS, Fold, find_fold

__all__ = ["MIN_BLOCKS", "Fold", "Unfolding", "find_fold", "fold"]


def fold(gm: fx.GraphModule, calls: dict[str, tuple[Any, Any, Any]] | None = None,
         alike: frozenset[str] = frozenset()) -> tuple[fx.GraphModule, Fold] | None:
    """A GraphModule with the head, the first two blocks and the tail (the tail reading the second
    block where it read the last), or None when nothing folds. `calls`, `alike`: as find_fold's."""
    found = find_fold(gm, calls, alike)
    if found is None:
        return None
    info_, head, tail, blocks, _ = found
    keep = set(head) | set(blocks[0]) | set(blocks[1]) | set(tail)
    if info_.blocks[-1] in alike:  # one call: the second block's output stands for it
        last_to_second = {blocks[-1][0]: calls[info_.blocks[1]][2]}  # type: ignore[index]
    else:
        last_to_second = dict(zip(blocks[-1], blocks[1]))
    dropped = tuple(name + "." for name in info_.blocks[2:])
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module") and node not in keep:
            continue
        if node.op == "get_attr" and str(node.target).startswith(dropped):
            continue  # a parameter of a block the second one stands for
        if node.op == "output" or node in tail:
            new = graph.node_copy(node, lambda a: env[last_to_second.get(a, a)])
        else:
            new = graph.node_copy(node, lambda a: env[a])
        env[node] = new
    # lazy: its Python code is generated only if it is ever run (the planner interprets its copies)
    folded = _LazyGraphModule(gm, graph, class_name=f"{type(gm).__name__}Folded")
    return folded, info_


_OPS = ("call_function", "call_method", "call_module")


class Unfolding:
    """The whole model's op sequence, seen through a compiled folded graph: every op is a folded node and
    a block copy (0 outside the repeated blocks; 1..L-1 for the copies of the second block), with the
    inputs and users each has in the whole graph. Nothing is copied: analyses walk these pairs.
    """

    def __init__(self, folded: fx.GraphModule, fold_: Fold | None) -> None:
        self.fold = fold_
        nodes = list(folded.graph.nodes)
        ops = [n for n in nodes if n.op in _OPS]
        if fold_ is None:
            self.first: set[fx.Node] = set()
            self.second: set[fx.Node] = set()
            self.sequence = [(n, 0) for n in ops]
        else:
            def block(n: fx.Node) -> str | None:
                return block_of(info(n).module or module_path(n))

            first = [n for n in ops if block(n) == fold_.blocks[0]]
            second = [n for n in ops if block(n) == fold_.blocks[1]]
            if len(first) != len(second) or not second:
                raise ValueError("the folded blocks compiled differently")
            self.first, self.second = set(first), set(second)
            # the first block's op -> the second block's op at its place, and back
            self.second_at = dict(zip(first, second))
            self.first_at = dict(zip(second, first))
            sequence: list[tuple[fx.Node, int]] = []
            placed = False
            for n in ops:
                if n in self.second:
                    if not placed:
                        sequence += [(m, k) for k in range(1, fold_.count) for m in second]
                        placed = True
                    continue
                sequence.append((n, 0))
            self.sequence = sequence
        self.position = {op: i for i, op in enumerate(self.sequence)}
        self.last_copy = fold_.count - 1 if fold_ is not None else 0

    def __len__(self) -> int:
        return len(self.sequence)

    def value(self, node: fx.Node, reader: tuple[fx.Node, int]) -> tuple[fx.Node, int]:
        """The copy of `node` that op `reader` reads in the whole graph."""
        op, copy = reader
        if op in self.second:
            if node in self.second:
                return node, copy
            if node in self.first and copy >= 2:  # the block before is a copy of the second block
                return self.second_at[node], copy - 1
        elif node in self.second:  # the tail reads the last block
            return node, self.last_copy
        return node, 0

    def users(self, node: fx.Node, copy: int) -> list[tuple[fx.Node, int]]:
        """The ops (and the output, as (output node, 0)) that read this copy of `node`."""
        found: list[tuple[fx.Node, int]] = []
        for user in node.users:
            if user in self.second:
                if node in self.second:
                    found.append((user, copy))
                elif node in self.first:
                    found.append((user, 1))
                else:  # a value of the head that every block reads
                    found += [(user, k) for k in range(1, self.last_copy + 1)]
            elif node in self.second and copy < self.last_copy:
                # what the tail reads of the last block, the next block reads of this one
                for reader in self.first_at[node].users:
                    if reader in self.second:
                        found.append((reader, copy + 1))
            else:
                found.append((user, 0))
        return found

    def intervals(self, recomp: set[fx.Node]) -> list[tuple[fx.Node, int, int, int]]:
        """(node, copy, first cut, last cut) for every value live across cuts, as pipeline_split's
        `liveness` counts them: from after its producer to its last reader, a value recomputed for
        itself never, and a value a recomputed one is made from as long as that one is read."""
        n = len(self.sequence)
        last: dict[tuple[fx.Node, int], int] = {}

        def last_use(value: tuple[fx.Node, int]) -> int:
            if value in last:
                return last[value]
            lu = -1
            for user in self.users(*value):
                if user[0].op == "output":
                    lu = max(lu, n)
                    continue
                at = self.position[user]
                lu = max(lu, at, last_use(user) if user[0] in recomp else at)
            last[value] = lu
            return lu

        found = []
        values = [(p, 0) for p in self.sequence[0][0].graph.nodes if p.op == "placeholder"] if n else []
        for value in [*values, *self.sequence]:
            if value[0] in recomp:
                continue
            start = self.position.get(value, -1) + 1
            end = last_use(value)
            if end >= start:
                found.append((value[0], value[1], start, end))
        return found
