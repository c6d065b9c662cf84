"""Parameters fast init has no distribution for, filled by the model's own constructor: a norm
whose weight starts at zeros and scales by (1 + weight) (Gemma's RMSNorm), and a learned gain
drawn at random. Fast init takes their constructor values (tests/test_fast_init.py)."""

import torch
import torch.nn as nn


class ZeroCenteredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * (1.0 + self.weight)


class Net(nn.Module):
    def __init__(self, dim: int = 64):
        super().__init__()
        self.norm = ZeroCenteredRMSNorm(dim)
        self.gain = nn.Parameter(torch.rand(dim) + 0.5)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(self.norm(x)) * self.gain


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(4, 64),)
