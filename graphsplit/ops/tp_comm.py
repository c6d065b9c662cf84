"""The tp communicator: how a stage graph's collectives reach the other tp ranks.

A `TPComm` is a module of the graph (`self.tp_comm`), so each rank's copy of a stage holds
its own: unbound it simulates rank 0 of `tp` ranks with exact shapes and no communication
(the meta analysis); a backend binds it to a `TPLink`: its tp process group (`GroupLink`,
`bind_tp_group`), or, in the local backend, a hub shared by one thread per tp rank
(backends/threads.py). It counts the collectives it runs, per (direction, kind). The
autograd functions that call it are ops/tp.py's.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn as nn

from ..ir.sharding import Shard, shard_tensor
from .communicator import Communicator

COMM_ATTR = "tp_comm"  # the attribute of a graph module that holds its communicator


class TPLink(Protocol):
    """How a communicator's collectives travel between the tp ranks: a process group
    (`GroupLink`) or threads of one process (`backends/threads.py`'s `ThreadLink`).

    Both take a contiguous tensor the caller owns and return a tensor no other rank
    aliases; `all_gather` returns every rank's tensor, in rank order."""

    size: int
    rank: int

    def all_reduce(self, x: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor: ...

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]: ...

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `x`, this rank's block of its dim 0."""
        ...

    def shift(self, x: torch.Tensor) -> Pending:
        """Send `x` to the next rank and receive the previous rank's (a ring step), in flight until
        `wait()` on what it returns gives the received tensor."""
        ...


class Pending(Protocol):
    """A ring step in flight: `wait()` returns what the previous rank sent."""

    def wait(self) -> torch.Tensor: ...


class _Arrived:
    """A ring step already done (one process's threads exchange at once)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def wait(self) -> torch.Tensor:
        return self.x


class _InFlight:
    """A ring step over a process group: its send and receive posted, waited for at `wait()`."""

    def __init__(self, works: list[dist.Work], received: torch.Tensor) -> None:
        self.works, self.received = works, received

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.received


class GroupLink:
    """Collectives over a `torch.distributed` process group (one rank per process)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_reduce(self, x: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        dist.all_reduce(x, op=op, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return parts

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((x.shape[0] // self.size, *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x, group=self.group)
        return out

    def shift(self, x: torch.Tensor) -> Pending:
        received = torch.empty_like(x)
        ahead, behind = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        # both posted together, so neither waits for the other side's matching call
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, group=self.group, group_peer=ahead),
                                        dist.P2POp(dist.irecv, received, group=self.group, group_peer=behind)])
        return _InFlight(works, received)


class TPComm(Communicator):
    """The tp ranks one graph's collectives run over.

    Unbound: rank 0 of `tp`, collectives shaped but not run (all-reduce returns its
    input, all-gather repeats it). Bound to a link: the real collectives, counted (a copy
    starts with no counts).
    """

    axis = "tp"
    link: TPLink | None

    def __init__(self, tp: int) -> None:
        super().__init__(tp)
        self.counts: Counter[tuple[str, str]] = Counter()

    @property
    def tp(self) -> int:
        return self.degree

    @property
    def size(self) -> int:
        return self.link.size if self.link is not None else self.tp

    @property
    def rank(self) -> int:
        return self.link.rank if self.link is not None else 0

    def all_reduce(self, x: torch.Tensor, direction: str, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        if self.link is None:
            return x
        if not torch.compiler.is_compiling():  # a count is Python state: dynamo would break the graph for it
            self.counts[(direction, "all_reduce")] += 1
        if self.size == 1:
            return x
        return self.link.all_reduce(x.contiguous(), op)

    def all_gather(self, x: torch.Tensor, dim: int, direction: str | None, size: int | None = None) -> torch.Tensor:
        """`direction` None: outside autograd and not counted (showing a sharded output).
        `size`: the blocks are padded; the padding at the end is cut off."""
        if self.link is None:
            whole = torch.cat([x] * self.size, dim=dim)
        else:
            if direction is not None and not torch.compiler.is_compiling():
                self.counts[(direction, "all_gather")] += 1
            if self.size == 1:
                return x
            x = x.detach() if direction is None else x
            whole = torch.cat(self.link.all_gather(x.contiguous()), dim=dim)
        return whole if size is None else whole.narrow(dim, 0, size)

    def reduce_scatter(self, x: torch.Tensor, dim: int, direction: str) -> torch.Tensor:
        """The sum over the ranks of `x`, this rank's block of `dim` (which tp divides)."""
        if self.link is None:
            return self.local_slice(x, dim)
        if not torch.compiler.is_compiling():
            self.counts[(direction, "reduce_scatter")] += 1
        if self.size == 1:
            return x
        # the link scatters dim 0: move `dim` there and back (a copy only when dim != 0)
        moved = x.movedim(dim, 0).contiguous()
        return self.link.reduce_scatter(moved).movedim(0, dim).contiguous()

    def shift(self, x: torch.Tensor) -> Pending:
        """A ring step (ops/async_tp.py): `x` to the next rank, the previous rank's tensor back once
        `wait()` is called on the result. Unbound: the rank's own tensor comes back (as `all_gather`
        repeats it). Not counted: a ring of them counts as the collective it replaces (`count`)."""
        if self.link is None or self.size == 1:
            return _Arrived(x)
        return self.link.shift(x.contiguous())

    def count(self, direction: str, kind: str) -> None:
        """One collective run as a ring of `shift`s (ops/async_tp.py)."""
        if self.link is not None:
            self.counts[(direction, kind)] += 1

    def local_slice(self, x: torch.Tensor, dim: int, size: int | None = None) -> torch.Tensor:
        """This rank's block of `x`; `size` given: of `x` padded with zeros to a multiple of tp."""
        n = self.size
        if n == 1:
            return x
        if size is None:
            return x.chunk(n, dim=dim)[self.rank].contiguous()
        return shard_tensor(x, Shard(dim % x.dim(), size=size), self.rank, n).contiguous()


def bind_tp(module: nn.Module, link: TPLink | None) -> None:
    """Bind every communicator inside `module` (its stages' graphs, checkpoint regions) to `link`."""
    for sub in module.modules():
        if isinstance(sub, TPComm):
            sub.bind(link)


def bind_tp_group(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Bind every communicator inside `module` to the process group `group` (None: unbind)."""
    bind_tp(module, GroupLink(group) if group is not None else None)


def tp_comms(module: nn.Module) -> list[TPComm]:
    return [m for m in module.modules() if isinstance(m, TPComm)]
