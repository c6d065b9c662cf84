"""How a value or a parameter is laid out over the tensor-parallel ranks.

Terms: an *axis* is a device-mesh axis (dp, pp, tp); a *dim* is a tensor
dimension. A value is `R` (every rank holds all of it), `S(dim)` (each rank
holds a contiguous 1/tp block of `dim`), or `P` (each rank holds a partial
sum). `chunks` describes a fused dim (QKV, gate+up): the dim is a
concatenation of chunks of these sizes and each rank holds its block of
*every* chunk, so splitting the local tensor gives each chunk's local block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sharding:
    kind: str  # "R", "S" or "P"
    dim: int | None = None
    chunks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("R", "S", "P"):
            raise ValueError(f"Sharding.kind must be R, S or P, got {self.kind!r}")
        if (self.kind == "S") != (self.dim is not None):
            raise ValueError("Sharding.dim is set exactly when kind is S")

    def __str__(self) -> str:
        if self.kind == "S":
            return f"S({self.dim}{', chunks=' + str(list(self.chunks)) if self.chunks else ''})"
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "chunks": list(self.chunks) if self.chunks else None}


R = Sharding("R")
P = Sharding("P")


def S(dim: int, chunks: tuple[int, ...] | None = None) -> Sharding:  # noqa: N802 - reads like the math
    return Sharding("S", dim, tuple(chunks) if chunks else None)


def local_shape(shape: tuple[int, ...], sharding: Sharding, tp: int) -> tuple[int, ...]:
    if sharding.kind != "S":
        return tuple(shape)
    out = list(shape)
    out[sharding.dim] //= tp
    return tuple(out)


def shard_tensor(full: torch.Tensor, sharding: Sharding, rank: int, tp: int) -> torch.Tensor:
    """This rank's block of `full` (a view where possible)."""
    if sharding.kind != "S" or tp == 1:
        return full
    dim = sharding.dim
    if sharding.chunks:
        pieces = torch.split(full, list(sharding.chunks), dim=dim)
        return torch.cat([p.chunk(tp, dim=dim)[rank] for p in pieces], dim=dim)
    return full.chunk(tp, dim=dim)[rank]
