"""The module a checkpointed region becomes: `self.ckpt_N(*inputs)` in stage code.

Forward runs the region under non-reentrant `torch.utils.checkpoint`, which keeps
only the region's inputs and recomputes the rest during backward (RNG state is
restored, so dropout draws the same masks). `selective=True` keeps the outputs
of matmul-class ops instead of recomputing them and recomputes only the cheap
ops around them (`create_selective_checkpoint_contexts`). Under a zero-bubble
schedule the backward runs twice through each region (input gradients, then
weight gradients: two recomputes), and torch's selective checkpoint hands each
kept output out once; `backward_twice=True` gives them out again. Buffers a region
updates in place (BatchNorm's running mean, variance and count) are put back
after the recompute, so they are updated once per forward, as without
checkpointing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

aten = torch.ops.aten
# The ops whose outputs a selective region keeps (analysis/memory.py counts them too).
SELECTIVE_KEEPS = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default, aten.matmul.default,
    aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default, aten.convolution.default,
}


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SELECTIVE_KEEPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts(backward_twice: bool) -> tuple[Any, Any]:
    forward_mode, recompute_mode = create_selective_checkpoint_contexts(_keep_matmuls)
    return forward_mode, (_KeptTwice(recompute_mode) if backward_twice else recompute_mode)


class _KeptTwice:
    """The recompute context of a selective region that each backward may enter: what the forward
    kept is handed out by the recompute and put back for the next one (torch marks it consumed).
    The kept outputs live as long as the region's graph, as they would for one backward that
    retains the graph."""

    def __init__(self, mode: Any) -> None:
        if not isinstance(getattr(mode, "storage", None), dict):
            raise RuntimeError("this torch's selective checkpoint keeps its outputs where graphsplit cannot "
                               "find them; use --checkpoint blocks with zero-bubble schedules")
        self.mode = mode

    def __enter__(self) -> Any:
        self.kept = {key: dict(entries) for key, entries in self.mode.storage.items()}
        return self.mode.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.mode.__exit__(*exc)
        finally:
            for key, entries in self.kept.items():
                self.mode.storage[key].update(entries)
            self.kept = {}


class CheckpointRegion(nn.Module):
    def __init__(self, inner: nn.Module, selective: bool = False, backward_twice: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.selective = selective
        self.backward_twice = backward_twice
        self.enabled = True

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled() or not self.enabled:
            return self.inner(*args)
        context = functools.partial(_selective_contexts, self.backward_twice) if self.selective else None
        kwargs = {"context_fn": context} if context is not None else {}
        return checkpoint(self._run_once(), *args, use_reentrant=False, **kwargs)

    def _run_once(self) -> Callable[..., Any]:
        """The region for one forward. Its second call is the recompute in backward: the buffers
        the first call updated in place (running statistics) are put back as they were after it."""
        calls = 0
        updated: list[torch.Tensor] = []

        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                before = [(b, b._version) for b in self.inner.buffers()]
                out = self.inner(*args)
                # batch norm's kernel updates running stats without bumping their version
                stats = {id(b) for m in self.inner.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                         and m.training for b in m.buffers()}
                updated.extend(b for b, version in before if b._version != version or id(b) in stats)
                return out
            saved = [(b, b.clone()) for b in updated]
            try:
                return self.inner(*args)
            finally:  # also when checkpoint stops the recompute early
                with torch.no_grad():
                    for b, value in saved:
                        b.copy_(value)

        return run
