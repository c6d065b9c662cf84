"""What --async-tp makes of a table's tp collectives: which become rings, over which matmuls.

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
"""

from __future__ import annotations

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
