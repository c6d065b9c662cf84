"""How a value or a parameter is laid out over the tensor-parallel ranks: layouts as types.

Terms: an *axis* is a device-mesh axis (dp, pp, tp); a *dim* is a tensor
dimension. A value is `Replicate()` (every rank holds all of it), `Shard(dim)`
(each rank holds a contiguous 1/tp block of `dim`) or `Partial()` (each rank
holds a partial sum), as DTensor's placements. `chunks` describes a fused dim
(QKV, gate+up): the dim is a concatenation of chunks of these sizes and each
rank holds its block of *every* chunk, so splitting the local tensor gives
each chunk's local block.

`size` describes a dim tp does not divide (a vocabulary of 50257 at tp 2): it is
padded internally to a multiple of tp, so each rank holds a block of
ceil(size / tp) and the last ranks' blocks end in padding. Padding rows are
zero in parameters, never looked up, masked out of a cross-entropy, cut off
where the value is gathered, and never written to a checkpoint: only the
first `size` entries are real (Megatron pads its vocabulary the same way).

    >>> Shard(0, (64, 64, 64)), str(Shard(1)), str(Replicate()), str(Shard(0, size=97))
    (Shard(dim=0, chunks=(64, 64, 64)), 'S(1)', 'R', 'S(0, size=97)')

`str()` is the form artifacts show (plan.json, the summary, report.html).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    size: int | None = None  # the dim's real size when tp does not divide it (padded internally)

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int):
            raise ValueError(f"Shard.dim must be an int, got {self.dim!r}")
        # one spelling per layout: no chunks is None, a list of chunks a tuple (equality, hashing)
        object.__setattr__(self, "chunks", tuple(self.chunks) if self.chunks else None)
        if self.size is not None and (not isinstance(self.size, int) or self.size < 1 or self.chunks):
            raise ValueError(f"Shard.size must be a positive int on an unfused dim, got {self.size!r}")

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    @property
    def padded(self) -> bool:
        return self.size is not None

    def moved(self, dim: int) -> Shard:
        """The same shard (chunks, padding) on another dim: a transpose or view moved it."""
        return replace(self, dim=dim)

    def _extra(self, chunks: str) -> str:
        return (f", {chunks}" if self.chunks else "") + (f", size={self.size}" if self.size is not None else "")

    def __str__(self) -> str:
        return f"S({self.dim}{self._extra('chunks=' + str(list(self.chunks or ())))})"

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim}{self._extra(f'chunks={self.chunks}')})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "S", "dim": self.dim, "chunks": list(self.chunks) if self.chunks else None}
        if self.size is not None:
            out["size"] = self.size
        return out


Layout = Replicate | Shard | Partial

R = Replicate()
P = Partial()
S = Shard  # S(1), S(0, chunks): reads like the math


def layout_str(layout: Layout | Sequence[Layout] | None) -> str:
    """The artifact form of a value's layout; a container's is its elements' in brackets."""
    if isinstance(layout, Sequence):
        return f"[{', '.join(str(x) for x in layout)}]"
    return str(layout)


def block_size(n: int, tp: int) -> int:
    """Rows per rank of a dim of `n` split over `tp` ranks, padded up where tp does not divide it."""
    return -(-n // tp)


def real_rows(layout: Shard, rank: int, tp: int, n: int) -> tuple[int, int]:
    """(start in the whole dim, count) of the real rows in `rank`'s block of a dim of `n`;
    the rest of a padded block is padding (a last rank may hold only padding)."""
    block = block_size(n, tp) if layout.padded else n // tp
    start = rank * block
    return start, max(0, min(block, n - start))


def local_shape(shape: tuple[int, ...], layout: Layout, tp: int) -> tuple[int, ...]:
    if not isinstance(layout, Shard):
        return tuple(shape)
    out = list(shape)
    out[layout.dim] = block_size(out[layout.dim], tp) if layout.padded else out[layout.dim] // tp
    return tuple(out)


def shard_tensor(full: torch.Tensor, layout: Layout, rank: int, tp: int, pad: bool = True) -> torch.Tensor:
    """This rank's block of `full` (a view where possible). A padded shard's block ends in zero
    rows (`pad=False`: only its real rows)."""
    if not isinstance(layout, Shard) or tp == 1:
        return full
    dim = layout.dim
    if layout.chunks:
        pieces = torch.split(full, list(layout.chunks), dim=dim)
        return torch.cat([p.chunk(tp, dim=dim)[rank] for p in pieces], dim=dim)
    if not layout.padded:
        return full.chunk(tp, dim=dim)[rank]
    start, count = real_rows(layout, rank, tp, full.shape[dim])
    real = full.narrow(dim, min(start, full.shape[dim]), count)
    missing = block_size(full.shape[dim], tp) - count
    if not pad or missing == 0:
        return real
    zeros = list(real.shape)
    zeros[dim] = missing
    return torch.cat([real, real.new_zeros(zeros)], dim=dim)


def unpad(local: torch.Tensor, layout: Layout, rank: int, tp: int) -> torch.Tensor:
    """The real rows of this rank's block `local` (all of it unless the shard is padded)."""
    if not isinstance(layout, Shard) or not layout.padded or tp == 1:
        return local
    _, count = real_rows(layout, rank, tp, layout.size)
    return local.narrow(layout.dim, 0, count)


def expert_block(value: torch.Tensor, dim: int, rank: int, ep: int) -> torch.Tensor:
    """What expert-parallel rank `rank` of `ep` holds of `value` (an expert weight, or the indices
    along its expert dim): block `rank` of `dim`, E / ep experts."""
    return value.chunk(ep, dim=dim)[rank] if ep > 1 else value
