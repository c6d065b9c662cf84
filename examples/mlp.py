"""A plain MLP: the smallest model graphsplit pipelines.

    graphsplit run examples/mlp.py --pp 2 --steps 5 --check
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 8, n_in: int = 32, n_out: int = 10):
        super().__init__()
        self.inp = nn.Linear(n_in, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.out = nn.Linear(width, n_out)

    def forward(self, x):
        x = F.gelu(self.inp(x))
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.out(x)


def build_model():
    return MLP()


def example_inputs():
    return (torch.randn(16, 32, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randn(16, 10, generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.mse_loss(output, target)
