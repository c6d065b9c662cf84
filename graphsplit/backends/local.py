"""local backend: every stage in one process, with the pipeline's semantics.

The batch is cut into the same micro-batches `torch.distributed.pipelining`
makes; each runs through the stages in order, the loss of each is
back-propagated, and gradients are summed then divided by the number of
micro-batches (the schedules' `scale_grads`). Copies of a tied parameter
held by several stages get the sum of their gradients. It is the fast
reference for tests and for `transform --check`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from ..program import Program
from ..runtime import merge_outputs, split_microbatches, sync_tied_grads


class LocalPipeline:
    def __init__(
        self,
        program: Program,
        stage_modules: Sequence[nn.Module],
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> None:
        self.program = program
        self.stages = list(stage_modules)
        self.loss_fn = loss_fn

    def forward_stages(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        values: Any = inputs
        for stage in self.stages:
            values = stage(*values) if isinstance(values, tuple) else stage(values)
        return values

    def step(self, inputs: tuple[torch.Tensor, ...], target: Any) -> tuple[torch.Tensor, Any]:
        """Forward + backward over all micro-batches; returns (mean loss, merged raw output)."""
        n = self.program.plan.num_microbatches
        chunks = split_microbatches(inputs, n)
        targets = split_microbatches(target, n)
        losses, outputs = [], []
        for mb_in, mb_target in zip(chunks, targets):
            out = self.forward_stages(mb_in)
            loss = self.loss_fn(out, mb_target)
            loss.backward()
            losses.append(loss.detach())
            outputs.append(out)
        for stage in self.stages:
            for p in stage.parameters():
                if p.grad is not None:
                    p.grad.div_(n)
        sync_tied_grads(self.program, dict(enumerate(self.stages)))
        return torch.stack(losses).mean(), merge_outputs(outputs)
