"""The per-step factor a mean over counted tokens becomes (passes/token_mean.py).

Each proven token mean of a graph is rewritten into `token_scaled(piece_sum, self.token_scale, k)`.
`TokenScale` is a module of the graph, as the tp communicator is, so each rank's copy of a stage
holds its own; before every step the backend sets its factors (`set_token_scales`): for mean k,
pieces / (the tokens it counts over the whole global batch), pieces being the micro-batches x dp
replicas whose losses the schedule and data parallelism average as equals. Averaged, the pieces'
losses are then the whole batch's sum over the whole batch's count: its mean, and so are the
gradients. The factor is data fed per step, never a constant of the trace.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx
import torch.nn as nn

from ..errors import GraphsplitError
from .eager import eager as _eager

SCALE_ATTR = "token_scale"  # the attribute of a graph module that holds its factors


class TokenScale(nn.Module):
    """This step's factors, one per token mean of the graph (no parameter, no buffer: nothing to save)."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.factors: torch.Tensor | None = None

    def factor(self, index: int, like: torch.Tensor) -> torch.Tensor:
        if self.factors is None:
            if like.device.type == "meta":  # shape analysis: any factor will do
                return torch.ones((), dtype=like.dtype, device="meta")
            raise GraphsplitError("internal: a mean over counted tokens ran before its step set the global count "
                                  "(runtime/token_count.py set_scales)")
        return self.factors[index]

    def extra_repr(self) -> str:
        return f"count={self.count}"


@torch.fx.wrap
@_eager
def token_scaled(value: torch.Tensor, scale: TokenScale, index: int) -> torch.Tensor:
    """`value`, one piece's sum over the tokens it counts, times this step's factor for mean `index`."""
    return value * scale.factor(index, value).to(value.dtype)


def set_token_scales(modules: Iterable[nn.Module], factors: torch.Tensor) -> None:
    """Give every `TokenScale` inside `modules` this step's factors."""
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, TokenScale):
                sub.factors = factors
