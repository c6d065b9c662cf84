"""The module a checkpointed region becomes: `self.ckpt_N(*inputs)` in stage code.

Forward runs the region under non-reentrant `torch.utils.checkpoint`, which keeps
only the region's inputs and recomputes the rest during backward (RNG state is
restored, so dropout draws the same masks). `selective=True` keeps the outputs
of matmul-class ops instead of recomputing them and recomputes only the cheap
ops around them (`create_selective_checkpoint_contexts`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

aten = torch.ops.aten
_SAVE = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default, aten.matmul.default,
         aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default,
         aten._scaled_dot_product_flash_attention_for_cpu.default, aten.convolution.default}


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


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
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
