"""The one place that inserts a tensor-parallel collective.

`Redistribute.to(value, need, at)` gives `at` the value in the layout it needs:

    have -> need        inserted before `at`
    S(d) -> R           gather_from_tp(value, d)        all-gather forward
    P    -> R           reduce_from_tp(value)           all-reduce forward (g)
    R    -> S(d)        scatter_to_tp(value, d)         all-gather backward
    R    -> S(d, chunks) scatter_chunks_to_tp(value, d, chunks)  all-gather backward

A padded shard (`Shard(d, size=n)`, a dim tp does not divide) moves the same
way with `size=n`: the gather cuts the padding off, the scatter's blocks end in it.
    R    -> BROADCAST   copy_to_tp(value)               all-reduce backward (f), if it needs a gradient
    S(d) -> BROADCAST   gather_for_column(value, d)     all-gather forward, reduce-scatter backward
                        (sequence parallelism: the tokens before a column-parallel layer)

One collective per (value, need), reused by every consumer: the input
gradients of column-parallel layers reading one value are summed by autograd
first and all-reduced once. `reduce_after(node)` sums a partial result where it
is made. Each collective's last argument is the graph's communicator, the
`get_attr` of `self.tp_comm` added once per graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

from ...errors import GraphsplitError
from ...ir.meta import TensorSpec, info, insert_node
from ...ir.op_kinds import OpKind
from ...ir.sharding import Layout, Replicate, Shard, local_shape
from ...ops import tp as tpops
from ...ops.tp_comm import COMM_ATTR, TPComm
from .decision import BROADCAST, Need
from .layout import layout_of

R = Replicate()


class Redistribute:
    def __init__(self, gm: fx.GraphModule, tp: int) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.tp = tp
        self._made: dict[tuple[fx.Node, Any], fx.Node] = {}
        self._comm: fx.Node | None = None

    def comm(self) -> fx.Node:
        """The graph's communicator (`self.tp_comm`), the last argument of every tp op."""
        if self._comm is None:
            self.gm.add_submodule(COMM_ATTR, TPComm(self.tp))
            first = next(n for n in self.graph.nodes if n.op != "placeholder")
            with self.graph.inserting_before(first):
                self._comm = self.graph.get_attr(COMM_ATTR)
            info(self._comm).value = "scalar"
        return self._comm

    def to(self, value: fx.Node, need: Need, at: fx.Node) -> fx.Node:
        """`value` in the layout `need`, for its consumer `at` (`value` itself if it already is)."""
        have = layout_of(value)
        key = (value, need)
        if key in self._made:
            return self._made[key]
        made = self._make(value, have, need, at)
        if made is not value:
            self._made[key] = made
        return made

    def _make(self, value: fx.Node, have: Layout, need: Need, at: fx.Node) -> fx.Node:
        if need is BROADCAST and isinstance(have, Shard):
            if have.chunks or have.padded:  # whole first, then f: the same sums in two collectives
                return self.to(self.to(value, R, at), BROADCAST, at)
            return self._insert(tpops.gather_for_column, (value, have.dim), like=value, owner=at, layout=R, before=at)
        if need is BROADCAST:
            spec = info(value).tensor
            if not have.is_replicate() or spec is None or not spec.requires_grad:
                return value  # no gradient flows back: nothing to sum
            # f belongs to the layer it feeds (Megatron's column-parallel input)
            return self._insert(tpops.copy_to_tp, (value,), like=value, owner=at, layout=R, before=at)
        if have == need:
            return value
        if isinstance(need, Replicate) and have.is_partial():
            return self._insert(tpops.reduce_from_tp, (value,), like=value, layout=R, before=at)
        if isinstance(need, Replicate) and isinstance(have, Shard):
            if have.chunks:  # every rank's block of every chunk, gathered and put back chunk by chunk
                return self._insert(tpops.gather_chunks_from_tp, (value, have.dim, have.chunks), like=value,
                                    layout=R, before=at)
            return self._insert(tpops.gather_from_tp, (value, have.dim), like=value, layout=R, before=at,
                                kwargs=_size(have))
        if isinstance(need, Shard) and have.is_replicate():
            spec = info(value).tensor
            shape = local_shape(tuple(spec.shape), need, self.tp) if spec is not None else None
            if need.chunks:  # this rank's block of every chunk (ALiBi's bias over a merged batch x heads dim)
                return self._insert(tpops.scatter_chunks_to_tp, (value, need.dim, need.chunks), like=value,
                                    layout=need, before=at, shape=shape)
            return self._insert(tpops.scatter_to_tp, (value, need.dim), like=value, layout=need, before=at, shape=shape,
                                kwargs=_size(need))
        raise GraphsplitError(f"internal: no redistribution of {value.name} from {have} to {need} for {at.name}")

    def reduce_after(self, node: fx.Node) -> fx.Node:
        """The sum over tp of the partial `node`, right after it (Megatron's g)."""
        return self._insert(tpops.reduce_from_tp, (node,), like=node, layout=R, after=node)

    def reduce_scatter_after(self, node: fx.Node, dim: int) -> fx.Node:
        """The sum over tp of the partial `node`, split along `dim`, right after it (sequence
        parallelism's replacement for g)."""
        # shaped as the whole value, as the rules read every value (the analysis after the walk
        # gives the local shape)
        return self._insert(tpops.reduce_scatter_to_tp, (node, dim), like=node, layout=Shard(dim), after=node)

    def _insert(
        self, fn: Callable[..., Any], args: tuple[Any, ...], *, like: fx.Node, layout: Layout,
        owner: fx.Node | None = None, before: fx.Node | None = None, after: fx.Node | None = None,
        shape: tuple[int, ...] | None = None, kwargs: dict[str, Any] | None = None,
    ) -> fx.Node:
        """A collective shaped like `like` (or `shape`), counted in `owner`'s module (default `like`'s)."""
        spec = info(like).tensor
        if shape is not None and spec is not None:
            spec = TensorSpec(shape, spec.dtype, spec.requires_grad)
        return insert_node(self.graph, fn, (*args, self.comm()), before=before, after=after, owner=owner or like,
                           kind=OpKind.COLLECTIVE, tensor=spec, sharding=layout, kwargs=kwargs)


def _size(layout: Shard) -> dict[str, Any] | None:
    """The collective's `size=` for a padded shard: the dim's real size."""
    return {"size": layout.size} if layout.padded else None
