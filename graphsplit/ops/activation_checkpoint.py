"""The module a checkpointed region becomes: `self.ckpt_N(*inputs)` in stage code.

Forward runs the region under non-reentrant `torch.utils.checkpoint`, which keeps
only the region's inputs and recomputes the rest during backward (RNG state is
restored, so dropout draws the same masks). `selective=True` keeps the outputs
of matmul-class ops instead of recomputing them and recomputes only the cheap
ops around them (`create_selective_checkpoint_contexts`). Buffers a region
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


class CheckpointRegion(nn.Module):
    def __init__(self, inner: nn.Module, selective: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.selective = selective
        self.enabled = True

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled() or not self.enabled:
            return self.inner(*args)
        context = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls) if self.selective else None
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
