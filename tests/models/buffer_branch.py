"""A branch on the model's own buffer, as minimind writes it (model_minimind.py:216): the RoPE-like
table is recomputed when its first entry is 0, which a meta-device init leaves. Built normally the
constructor fills it, and the branch is not taken."""

import torch
import torch.nn as nn


def table(n: int, d: int) -> torch.Tensor:
    return torch.cos(torch.arange(n, dtype=torch.float32)[:, None] / (1 + torch.arange(d, dtype=torch.float32)))


class BufferBranch(nn.Module):
    def __init__(self, width: int = 8, length: int = 6):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.register_buffer("freqs", table(length, width), persistent=False)

    def forward(self, x):
        if self.freqs[0, 0] == 0:  # lost to a meta init: recompute (never, built as graphsplit builds it)
            self.freqs = table(*self.freqs.shape).to(x.device)
        h = self.inp(x) * self.freqs[: x.shape[1]]
        return self.out(torch.relu(h))


def build_model():
    return BufferBranch()


def example_inputs():
    return (torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0)),)
