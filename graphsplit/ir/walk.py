"""One walk over a graph's nodes: each node reachable from some starts, once. Passes and analyses ask
it instead of writing their own work lists; `step` says where to go from a node (its inputs, its
users, or a filtered part of them), and a caller that has its answer stops by leaving the loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch.fx as fx


def reachable(starts: Iterable[fx.Node], step: Callable[[fx.Node], Iterable[fx.Node]]) -> Iterator[fx.Node]:
    """Each node reachable from `starts` by `step` (the starts included), once, depth first."""
    seen: set[fx.Node] = set()
    todo = list(starts)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        todo.extend(step(node))


def inputs(node: fx.Node) -> list[fx.Node]:
    return node.all_input_nodes


def users(node: fx.Node) -> Iterable[fx.Node]:
    return node.users
