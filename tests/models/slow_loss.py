"""A small MLP whose loss takes 50 ms per micro-batch (the loss runs outside the traced stages).

The kill-and-resume test stops a run as soon as it reports a checkpoint; slow steps make
sure the run cannot write the next checkpoint before the kill lands.
"""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def build_model():
    return MLP()


def example_inputs():
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    time.sleep(0.05)
    return F.mse_loss(output, target)
