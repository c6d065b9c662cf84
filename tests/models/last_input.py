"""A model whose second input is read only at the very end, so it must cross every stage,
and whose first and last layers share one weight (tied), so their stages sum its gradient."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LastInput(nn.Module):
    def __init__(self, width: int = 32, depth: int = 6):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.shared = nn.Parameter(torch.randn(width, 16) * 0.1)

    def forward(self, x, scale):
        h = F.linear(x, self.shared)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        out = F.linear(h, self.shared.t())  # the same tensor again, in the last stage
        return out * scale


def build_model():
    return LastInput()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(8, 16, generator=g), "scale": torch.rand(8, 16, generator=g) + 0.5}


def example_target():
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def loss_fn(out, target):
    return F.mse_loss(out, target)
