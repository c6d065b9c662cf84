"""--fp8 tensorwise with --sequence-parallel: the gathered tokens cast once and gathered in float8.

Where sequence parallelism's `gathered = gather_for_column(shard)` is read only by float8 column
linears of the tensorwise recipe (passes/float8.py's `float8_linear(gathered, w, b, comm, "tensorwise",
"column", shard, dim)`, after autocast through at most one cast), they become one
`float8_gathered_linears(shard, weights, biases, dim, comm, recipe)` (ops/float8_gather.py): the shard
cast to float8 with the whole tensor's scale, gathered as bytes, read by every linear; backward keeps
the float8 shard and gathers it once for all the weights' gradients. torchao's float8 tensor
parallelism gathers so (`PrepareFloat8ModuleInput`).

Likewise a tensorwise float8 row linear whose output only sequence parallelism's reduce-scatter reads
becomes `float8_linear_reduce_scatter`: backward, the output's gradient is cast on its shard and gathered
in float8 (torchao's `Float8RowwiseParallel` casts the gradient before that gather too).

`float8_gather_sites(graph)` and `float8_row_sites(graph)` find them, for this pass and for the planner (planner/tabulate.py), so
what is priced is what the pass rewrites. Runs after autocast (which has the gather read the shard in
the linears' dtype) and before --async-tp, whose rings leave float8 linears alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from ..analysis.shapes import annotate
from ..ir.meta import info, insert_node
from ..ir.op_kinds import OpKind
from ..ops import tp as tpops
from ..ops.float8 import float8_linear
from ..ops.float8_gather import float8_gathered_linears, float8_linear_reduce_scatter
from .async_tp import fuse_gathered_linears, is_cast
from .manager import PassInput, PassResults
from .tensor_parallel import TensorParallelResult


@dataclass(frozen=True)
class Float8GatherSite:
    """`gather` (sequence parallelism's all-gather of `shard`) read by the float8 column `linears` alone."""

    gather: fx.Node
    shard: fx.Node
    linears: tuple[fx.Node, ...]


def _readers(gather: fx.Node) -> list[fx.Node]:
    readers = list(gather.users)
    if len(readers) == 1 and is_cast(readers[0]):  # a cast of the gathered tokens all the linears read
        readers = list(readers[0].users)
    return readers


def _site(gather: fx.Node) -> Float8GatherSite | None:
    readers = _readers(gather)
    dim = gather.args[1]
    if not readers or any(r.op != "call_function" or r.target is not float8_linear or len(r.args) < 8
                          or r.args[4] != "tensorwise" or r.args[5] != "column" or r.args[7] != dim
                          for r in readers):
        return None
    order = {n: i for i, n in enumerate(gather.graph.nodes)}
    return Float8GatherSite(gather, gather.args[0], tuple(sorted(readers, key=order.__getitem__)))


def float8_gather_sites(gm: fx.GraphModule) -> list[Float8GatherSite]:
    """The gathers read by tensorwise float8 column linears alone."""
    return [site for node in gm.graph.nodes
            if node.op == "call_function" and node.target is tpops.gather_for_column
            and (site := _site(node)) is not None]


def float8_row_sites(gm: fx.GraphModule) -> list[fx.Node]:
    """The reduce-scatters of a tensorwise float8 row linear's output, which only they read: their
    backward gathers the gradient in float8."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not tpops.reduce_scatter_to_tp:
            continue
        linear = node.args[0]
        if isinstance(linear, fx.Node) and linear.op == "call_function" and linear.target is float8_linear \
                and len(linear.users) == 1 and len(linear.args) >= 6 and linear.args[4] == "tensorwise" \
                and linear.args[5] == "row" and (len(linear.args) < 7 or linear.args[6] is None):
            found.append(node)
    return found


def _rewrite_row(gm: fx.GraphModule, reduce_scatter: fx.Node) -> None:
    linear = reduce_scatter.args[0]
    x, weight, bias, comm, recipe = linear.args[:5]
    fused = insert_node(gm.graph, float8_linear_reduce_scatter, (x, weight, bias, reduce_scatter.args[1], comm, recipe),
                        before=reduce_scatter, owner=reduce_scatter, kind=OpKind.LINEAR,
                        tensor=info(reduce_scatter).tensor, sharding=info(reduce_scatter).sharding)
    reduce_scatter.replace_all_uses_with(fused)
    gm.graph.erase_node(reduce_scatter)
    gm.graph.erase_node(linear)


def _rewrite(gm: fx.GraphModule, site: Float8GatherSite) -> None:
    comm, recipe = site.linears[0].args[3:5]
    fuse_gathered_linears(gm, site.gather, site.linears, float8_gathered_linears, 1,
                          lambda weights, biases: (site.shard, weights, biases, site.gather.args[1], comm, recipe))


def float8_gather_pass(gm: fx.GraphModule, inp: PassInput,
                       done: PassResults) -> tuple[fx.GraphModule, Float8GatherResult | None]:
    """The float8 column linears' gathers in float8 (None without --fp8 tensorwise and tp)."""
    if inp.plan.fp8 != "tensorwise" or inp.plan.tp == 1 or not inp.plan.sequence_parallel:
        return gm, None
    sites, rows = float8_gather_sites(gm), float8_row_sites(gm)
    for site in sites:
        _rewrite(gm, site)
    for reduce_scatter in rows:
        _rewrite_row(gm, reduce_scatter)
    if sites or rows:
        gm.graph.lint()
        gm.recompile()
        tp = done.get(TensorParallelResult)
        annotate(gm, inp.example_inputs, param_shardings=dict(tp.param_shardings) if tp else {}, tp=inp.plan.tp)
    return gm, Float8GatherResult(len(sites), len(rows))


@dataclass(frozen=True)
class Float8GatherResult:
    """How many gathers (each with its float8 column linears) gather float8, and how many row linears'
    reduce-scatters gather their gradient in float8."""

    gathers: int
    reduce_scatters: int
