"""How a value or a parameter is laid out over the tensor-parallel ranks: layouts as types.

Terms: an *axis* is a device-mesh axis (dp, pp, tp); a *dim* is a tensor
dimension. A value is `Replicate()` (every rank holds all of it), `Shard(dim)`
(each rank holds a contiguous 1/tp block of `dim`) or `Partial()` (each rank
holds a partial sum), as DTensor's placements. `chunks` describes a fused dim
(QKV, gate+up): the dim is a concatenation of chunks of these sizes and each
rank holds its block of *every* chunk, so splitting the local tensor gives
each chunk's local block.

    >>> Shard(0, (64, 64, 64)), str(Shard(1)), str(Replicate())
    (Shard(dim=0, chunks=(64, 64, 64)), 'S(1)', 'R')

`str()` is the form artifacts show (plan.json, the summary, report.html).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


class Placement:
    """What every layout answers, so no caller compares kinds."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


@dataclass(frozen=True, repr=False)
class Replicate(Placement):
    def is_replicate(self) -> bool:
        return True

    def __str__(self) -> str:
        return "R"

    def __repr__(self) -> str:
        return "Replicate()"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "R", "dim": None, "chunks": None}


@dataclass(frozen=True, repr=False)
class Partial(Placement):
    """Each rank holds a summand; the value is the sum over tp."""

    def is_partial(self) -> bool:
        return True

    def __str__(self) -> str:
        return "P"

    def __repr__(self) -> str:
        return "Partial()"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "P", "dim": None, "chunks": None}


@dataclass(frozen=True, repr=False)
class Shard(Placement):
    dim: int
    chunks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int):
            raise ValueError(f"Shard.dim must be an int, got {self.dim!r}")
        # one spelling per layout: no chunks is None, a list of chunks a tuple (equality, hashing)
        object.__setattr__(self, "chunks", tuple(self.chunks) if self.chunks else None)

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __str__(self) -> str:
        return f"S({self.dim}{', chunks=' + str(list(self.chunks)) if self.chunks else ''})"

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim}{f', chunks={self.chunks}' if self.chunks else ''})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "S", "dim": self.dim, "chunks": list(self.chunks) if self.chunks else None}


Layout = Replicate | Shard | Partial

R = Replicate()
P = Partial()
S = Shard  # S(1), S(0, chunks): reads like the math


def layout_str(layout: Layout | Sequence[Layout] | None) -> str:
    """The artifact form of a value's layout; a container's is its elements' in brackets."""
    if isinstance(layout, Sequence):
        return f"[{', '.join(str(x) for x in layout)}]"
    return str(layout)


def local_shape(shape: tuple[int, ...], layout: Layout, tp: int) -> tuple[int, ...]:
    if not isinstance(layout, Shard):
        return tuple(shape)
    out = list(shape)
    out[layout.dim] //= tp
    return tuple(out)


def shard_tensor(full: torch.Tensor, layout: Layout, rank: int, tp: int) -> torch.Tensor:
    """This rank's block of `full` (a view where possible)."""
    if not isinstance(layout, Shard) or tp == 1:
        return full
    dim = layout.dim
    if layout.chunks:
        pieces = torch.split(full, list(layout.chunks), dim=dim)
        return torch.cat([p.chunk(tp, dim=dim)[rank] for p in pieces], dim=dim)
    return full.chunk(tp, dim=dim)[rank]
