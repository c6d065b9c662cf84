"""Two linears and a norm: one column-parallel / row-parallel pair at tp 2, the fewest collectives
(so the fewest graph breaks) a tp test of torch.compile can have (tests/test_compile_stages.py)."""

import torch
import torch.nn as nn


class TPMLP(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def build_model():
    return TPMLP()


def example_inputs():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(0)),)
