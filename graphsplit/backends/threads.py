"""tp ranks as threads of one process: the collectives' semantics without processes.

Each tp rank runs in a thread of its own and binds its graphs' communicators
(`ops/tp_comm.py`'s `TPComm`) to a `ThreadLink`: every collective is one exchange on a
`ThreadHub` shared by the ranks. Each rank puts its tensor on the hub, waits for
all, computes the result from all ranks' tensors in rank order (so every rank gets
the same bits), and waits again before anyone's next collective may overwrite its
slot. Autograd runs a CPU backward on the thread that calls it, so backward
collectives work the same way.

A rank that fails breaks the hub's barrier, so the others stop at their next
collective instead of waiting for it forever; `run_ranks` raises the first real error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from ..ir.op_kinds import draws

T = TypeVar("T")

_REDUCE = {
    dist.ReduceOp.SUM: lambda parts: torch.stack(parts).sum(0),
    dist.ReduceOp.MAX: lambda parts: torch.stack(parts).amax(0),
    dist.ReduceOp.MIN: lambda parts: torch.stack(parts).amin(0),
}


class ThreadHub:
    """Where `size` threads meet for each collective."""

    def __init__(self, size: int, timeout_s: float = 120.0) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout_s)
        self._slots: list[torch.Tensor | None] = [None] * size

    def exchange(self, rank: int, x: torch.Tensor, combine: Callable[[list[torch.Tensor]], T]) -> T:
        """Every rank calls this with its tensor; each gets `combine(all ranks' tensors)`."""
        self._slots[rank] = x
        self._barrier.wait()
        try:
            return combine([t for t in self._slots if t is not None])
        finally:
            self._barrier.wait()  # no slot is reused until every rank has read them all

    def abort(self) -> None:
        self._barrier.abort()


class ThreadLink:
    """One tp rank's end of a `ThreadHub`: the `TPLink` of ops/tp_comm.py."""

    def __init__(self, hub: ThreadHub, rank: int) -> None:
        self.hub = hub
        self.size = hub.size
        self.rank = rank

    def all_reduce(self, x: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        return self.hub.exchange(self.rank, x, _REDUCE[op])

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.hub.exchange(self.rank, x, lambda parts: [p.clone() for p in parts])

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        return self.hub.exchange(self.rank, x, lambda parts: torch.stack(parts).sum(0).chunk(self.size)[self.rank].clone())

    def shift(self, x: torch.Tensor) -> _Received:
        """A ring step, done at once: the previous rank's tensor."""
        return _Received(self.hub.exchange(self.rank, x, lambda parts: parts[(self.rank - 1) % self.size].clone()))


class _Received:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def wait(self) -> torch.Tensor:
        return self.x


def run_ranks(hub: ThreadHub, work: Callable[[int], T]) -> list[T]:
    """`work(rank)` for every rank of `hub`, each in its own thread; the results in rank order.

    The first exception a rank raises is raised here (the others, stopped by the broken
    barrier, raise `BrokenBarrierError`, which says nothing more)."""
    results: list[Any] = [None] * hub.size
    errors: list[BaseException | None] = [None] * hub.size

    def target(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors[rank] = exc
            hub.abort()

    threads = [threading.Thread(target=target, args=(rank,), name=f"tp-rank-{rank}") for rank in range(hub.size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    first = real[0] if real else next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


class SameDraws(TorchFunctionMode):
    """A tp rank's random draws when tp ranks are threads of one process: every draw (torch.rand in a
    model, MAE's random masking) comes from this rank's own copy of torch's generator state, all ranks
    starting from the same, so each rank draws what the others do whatever the threads' interleaving,
    as real ranks seeded alike do. Entered in the rank's thread (a TorchFunctionMode is per thread)."""

    _lock = threading.Lock()

    def __init__(self, state: torch.Tensor) -> None:
        super().__init__()
        self.state = state

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__ if isinstance(func, torch._ops.OpOverload) else getattr(func, "__name__", "")
        if not draws(name):
            return func(*args, **kwargs)
        with SameDraws._lock:
            outside = torch.get_rng_state()
            torch.set_rng_state(self.state)
            try:
                return func(*args, **kwargs)
            finally:
                self.state = torch.get_rng_state()
                torch.set_rng_state(outside)
