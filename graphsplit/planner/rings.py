"""What --async-tp and --fp8 make of a table's tp collectives: which become rings, over which matmuls;
which a float8 linear keeps plain, and which tensorwise float8 gathers a byte an element.

`ring_tags(gm, same, tp)` reads the sites `passes/async_tp.py` rewrites (`ring_sites`, the one rule)
and tags each collective they replace, keyed by (node, direction, kind):

- a column site's gather: its forward all-gather and backward reduce-scatter become rings over its
  linears' forward and input-gradient matmuls; the first linear's backward all-gather of the kept
  shard becomes the one ring over all their weight-gradient matmuls, the others' are `DROPPED`;
- a row site's reduce-scatter: forward, a ring over its linear's forward; backward, the gradient's
  all-gather over its input- and weight-gradient matmuls (twice the forward's work).

A tag is (bytes per sample, constant, the matmul nodes, how many forward matmuls' work they are): the
bytes are what the ring moves, the gathered shard in the dtype the linears read it (under autocast, the
low one, where the plain program gathers fp32 tokens and casts them after).

`float8_tags(gm, same, tp, is_float8)` says, for the same sites, what --fp8 changes: a gather read by
float8 column linears alone is, under the tensorwise recipe, `float8_gathered_linears`
(passes/float8_gather.py): its forward gather and the first linear's backward re-gather move a byte per
element, the others' re-gathers are `DROPPED`, and the linears cast the shard once; a float8 row
linear's reduce-scatter gathers its gradient a byte an element backward (`float8_linear_reduce_scatter`).
Under --async-tp those stay rings, of float8 chunks (ops/float8_ring.py), their casts compiled kernels
under --compile as a compiled float8 linear's are; every other site with a float8 linear (rowwise, or a gather read by a linear float8 leaves
alone as well) is no ring: `ring_sites` of the program's graph leaves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from ..analysis.collectives import payload_bytes
from ..ir.meta import info
from ..passes.async_tp import ring_sites

DROPPED = ("dropped",)  # a collective the ring of another op does for it
RingTag = tuple[int, int, tuple[Any, ...], float]


def _pair(two: int, four: int) -> tuple[int, int]:
    per_sample = (four - two) // 2
    return per_sample, two - 2 * per_sample


def _bytes(node: fx.Node) -> int:
    spec = info(node).tensor
    return spec.nbytes if spec is not None else 0


@dataclass(frozen=True)
class Float8Tags:
    """--fp8's changes to the sites' collectives and casts."""

    # (node, direction, kind) -> (a ring under tensorwise float8 --async-tp, else none under --fp8; the
    # bytes under tensorwise gathering: a (per sample, constant) pair, DROPPED, or None where unchanged)
    collectives: dict[tuple[fx.Node, str, str], tuple[bool, Any]]
    # a tensorwise-gathering site's linear -> the shard it casts (the first linear), or None (the others)
    casts: dict[fx.Node, fx.Node | None]


def float8_tags(gm: fx.GraphModule, same: dict[fx.Node, fx.Node], tp: int,
                is_float8: Callable[[fx.Node], bool]) -> Float8Tags:
    """What --fp8 changes of the ring sites' collectives (module docstring); `is_float8`: whether
    passes/float8.py makes a linear float8."""
    columns, rows = ring_sites(gm)
    tags: dict[tuple[fx.Node, str, str], tuple[bool, Any]] = {}
    casts: dict[fx.Node, fx.Node | None] = {}
    for site in columns:
        floats = [is_float8(linear) for linear in site.linears]
        if not any(floats):
            continue
        gathered: Any = None
        ringed = all(floats)
        if ringed:  # tensorwise: float8_gathered_linears (ring_float8_gathered_linears under --async-tp)
            spec = info(site.shard).tensor
            size = max(spec.dtype.itemsize, 1) if spec is not None else 1
            gathered = _pair(_bytes(site.shard) * tp // size, _bytes(same[site.shard]) * tp // size)
            casts.update({linear: (site.shard if i == 0 else None) for i, linear in enumerate(site.linears)})
        tags[(site.gather, "forward", "all_gather")] = (ringed, gathered)
        tags[(site.gather, "backward", "reduce_scatter")] = (ringed, None)
        for i, linear in enumerate(site.linears):
            tags[(linear, "backward", "all_gather")] = (ringed, None if gathered is None else
                                                        gathered if i == 0 else DROPPED)
    for site in rows:
        if is_float8(site.linear):  # tensorwise: float8_linear_reduce_scatter, its gradient gathered in float8
            rs = site.reduce_scatter
            spec = info(rs).tensor
            size = max(spec.dtype.itemsize, 1) if spec is not None else 1
            gradient = _pair(payload_bytes(rs, tp) // size, payload_bytes(same[rs], tp) // size)
            tags[(rs, "forward", "reduce_scatter")] = (True, None)
            tags[(rs, "backward", "all_gather")] = (True, gradient)
    return Float8Tags(tags, casts)


def ring_tags(gm: fx.GraphModule, same: dict[fx.Node, fx.Node], tp: int) -> dict[tuple[fx.Node, str, str], Any]:
    """(node, direction, kind) -> a `RingTag`, or `DROPPED`, for the collectives --async-tp replaces."""
    columns, rows = ring_sites(gm)
    tags: dict[tuple[fx.Node, str, str], Any] = {}
    for site in columns:
        whole = _pair(_bytes(site.shard) * tp, _bytes(same[site.shard]) * tp)
        linears = site.linears
        tags[(site.gather, "forward", "all_gather")] = (*whole, linears, 1.0)
        tags[(site.gather, "backward", "reduce_scatter")] = (*whole, linears, 1.0)
        tags[(linears[0], "backward", "all_gather")] = (*whole, linears, 1.0)
        for other in linears[1:]:
            tags[(other, "backward", "all_gather")] = DROPPED
    for site in rows:
        rs = site.reduce_scatter
        whole = _pair(payload_bytes(rs, tp), payload_bytes(same[rs], tp))
        tags[(rs, "forward", "reduce_scatter")] = (*whole, (site.linear,), 1.0)
        tags[(rs, "backward", "all_gather")] = (*whole, (site.linear,), 2.0)
    return tags
