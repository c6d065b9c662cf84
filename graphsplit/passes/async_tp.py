"""--async-tp: sequence parallelism's all-gathers and reduce-scatters as rings beside their matmuls.

Where sequence parallelism left `gathered = gather_for_column(x)` read only by column-parallel linears
(`column_linear_from_seq_shard`, after autocast through one cast), the linears become one
`ring_column_linears(shard, weights, biases)`; where a row-parallel linear's output goes only to
`reduce_scatter_to_tp`, the pair becomes `ring_linear_reduce_scatter` (ops/async_tp.py). Under
`--fp8 tensorwise` the float8 gathers passes/float8_gather.py wrote (`float8_gathered_linears`,
`float8_linear_reduce_scatter`) become their rings of float8 chunks (ops/float8_ring.py). Anything else
reading the gathered tokens, and the other float8 linears (rowwise: torchao gathers their tokens in the
high dtype, each linear casting them itself), keep the plain collectives.

`ring_sites(graph)` finds them, for this pass and for the planner (planner/tabulate.py marks the
collectives each site replaces and the matmuls each ring hides behind), so what is priced is what the
pass rewrites. Runs after autocast (the ring gathers the shard in the linears' dtype, the bytes they
read) and before the pipeline cut and checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import getitem as operator_getitem

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..analysis.shapes import annotate
from ..ir.meta import info, insert_node
from ..ir.op_kinds import OpKind
from ..ops import tp as tpops
from ..ops.async_tp import ring_column_linears, ring_linear_reduce_scatter
from ..ops.float8_gather import float8_gathered_linears, float8_linear_reduce_scatter
from ..ops.float8_ring import ring_float8_gathered_linears, ring_float8_linear_reduce_scatter
from .manager import PassInput, PassResults
from .tensor_parallel import TensorParallelResult
from .tensor_parallel.spellings import linear_form


@dataclass(frozen=True)
class ColumnSite:
    """`gather` (sequence parallelism's all-gather of `shard`'s tokens) read by `linears` alone."""

    gather: fx.Node
    shard: fx.Node  # what the linears keep and the ring gathers (the tokens' shard, cast as they read it)
    linears: tuple[fx.Node, ...]


@dataclass(frozen=True)
class RowSite:
    """A row-parallel `linear` whose output only `reduce_scatter` reads."""

    linear: fx.Node
    reduce_scatter: fx.Node


def is_cast(node: fx.Node) -> bool:
    return node.op == "call_method" and node.target == "to"


def _column_site(gather: fx.Node) -> ColumnSite | None:
    readers = list(gather.users)
    if len(readers) == 1 and is_cast(readers[0]):  # autocast's one cast of the gathered tokens
        readers = list(readers[0].users)
    if not readers or any(r.op != "call_function" or r.target is not tpops.column_linear_from_seq_shard
                          for r in readers):
        return None
    shards = {r.args[1] for r in readers}
    dims = {r.args[4] for r in readers}
    if len(shards) != 1 or dims != {gather.args[1]}:
        return None
    order = {n: i for i, n in enumerate(gather.graph.nodes)}
    return ColumnSite(gather, shards.pop(), tuple(sorted(readers, key=order.__getitem__)))


def _row_site(reduce_scatter: fx.Node) -> RowSite | None:
    linear = reduce_scatter.args[0]
    # F.linear (aten.linear) alone: a float8 linear keeps its plain collectives
    if not isinstance(linear, fx.Node) or len(linear.users) != 1 or linear.op != "call_function" \
            or linear.target not in (F.linear, torch.ops.aten.linear.default):
        return None
    return RowSite(linear, reduce_scatter)


def ring_sites(gm: fx.GraphModule) -> tuple[list[ColumnSite], list[RowSite]]:
    """Where --async-tp puts rings: the gathers read by column linears alone, the row linears whose
    output only a reduce-scatter reads."""
    columns, rows = [], []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is tpops.gather_for_column and (site := _column_site(node)) is not None:
            columns.append(site)
        elif node.target is tpops.reduce_scatter_to_tp and (site := _row_site(node)) is not None:
            rows.append(site)
    return columns, rows


def hoist(value: object, before: fx.Node, order: dict[fx.Node, int]) -> None:
    """Move `value` (a weight's chain from its parameter: get_attr, casts) and what it reads to just
    before `before`, where it lies after it."""
    if not isinstance(value, fx.Node) or order[value] < order[before]:
        return
    for src in value.all_input_nodes:
        hoist(src, before, order)
    before.prepend(value)
    order[value] = order[before] - 0.5


def fuse_gathered_linears(gm: fx.GraphModule, gather: fx.Node, linears: tuple[fx.Node, ...], fn: object,
                          weight_at: int, args: Callable[[tuple[object, ...], tuple[object, ...]], tuple[object, ...]]) -> None:
    """`linears` (each reading `gather`'s tokens, in graph order; its weight argument `weight_at`, its bias
    the next) as one call of `fn` returning their outputs in order, its arguments `args(weights, biases)`:
    the weights and biases moved before the first linear, each linear's readers reading its item, the
    linears, the gather and its cast erased."""
    first = linears[0]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    weights = tuple(r.args[weight_at] for r in linears)
    biases = tuple(r.args[weight_at + 1] for r in linears)
    for value in (*weights, *biases):
        hoist(value, first, order)
    fused = insert_node(gm.graph, fn, args(weights, biases), before=first, owner=first, kind=OpKind.LINEAR,
                        value="container")
    for i, linear in enumerate(linears):
        out = insert_node(gm.graph, operator_getitem, (fused, i), before=first, owner=linear, kind=OpKind.GETITEM,
                          tensor=info(linear).tensor, sharding=info(linear).sharding)
        linear.replace_all_uses_with(out)
    for linear in reversed(linears):
        gm.graph.erase_node(linear)
    for node in (*gather.users, gather):  # the cast (if any), then the gather: no readers left
        if not node.users:
            gm.graph.erase_node(node)


def _rewrite_column(gm: fx.GraphModule, site: ColumnSite) -> None:
    first = site.linears[0]
    fuse_gathered_linears(gm, site.gather, site.linears, ring_column_linears, 2,
                          lambda weights, biases: (site.shard, weights, biases, first.args[4], first.args[5]))


def _rewrite_row(gm: fx.GraphModule, site: RowSite) -> None:
    x, weight, bias, *_ = linear_form(site.linear)
    _, dim, comm = site.reduce_scatter.args
    fused = insert_node(gm.graph, ring_linear_reduce_scatter, (x, weight, bias, dim, comm), before=site.reduce_scatter,
                        owner=site.reduce_scatter, kind=OpKind.LINEAR, tensor=info(site.reduce_scatter).tensor,
                        sharding=info(site.reduce_scatter).sharding)
    site.reduce_scatter.replace_all_uses_with(fused)
    gm.graph.erase_node(site.reduce_scatter)
    gm.graph.erase_node(site.linear)


FLOAT8_RINGS = {float8_gathered_linears: ring_float8_gathered_linears,
                float8_linear_reduce_scatter: ring_float8_linear_reduce_scatter}


def async_tp_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, AsyncTPResult | None]:
    """Sequence parallelism's collectives as rings (None without --async-tp)."""
    if not inp.plan.async_tp:
        return gm, None
    columns, rows = ring_sites(gm)
    for site in columns:
        _rewrite_column(gm, site)
    for site in rows:
        _rewrite_row(gm, site)
    floats = [0, 0]
    for node in gm.graph.nodes:  # the float8 gathers: the same arguments, their gathers rings
        ring = FLOAT8_RINGS.get(node.target) if node.op == "call_function" else None
        if ring is not None:
            floats[ring is ring_float8_linear_reduce_scatter] += 1
            node.target = ring
            if inp.plan.compile:  # the ring op is eager: its casts compiled kernels of their own
                node.kwargs = {**node.kwargs, "compiled": True}
    gm.graph.lint()
    gm.recompile()
    tp = done.get(TensorParallelResult)
    annotate(gm, inp.example_inputs, param_shardings=dict(tp.param_shardings) if tp else {}, tp=inp.plan.tp)
    return gm, AsyncTPResult(len(columns) + floats[0], len(rows) + floats[1])


@dataclass(frozen=True)
class AsyncTPResult:
    """How many gathers (with their column linears) and reduce-scatters (with their row linear) became rings."""

    gathers: int
    reduce_scatters: int



