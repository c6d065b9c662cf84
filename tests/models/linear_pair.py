"""One column-parallel and one row-parallel linear on the data itself, and an MSE loss: under tp every
value a float8 scale is taken over is exactly the untouched model's (no earlier row-parallel sum adds
float32 rounding), so tests/test_fp8.py can hold the shards' scales to torchao's exactly."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearPair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def build_model():
    return LinearPair()


def example_inputs():
    return (torch.randn(8, 16, 64, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randn(8, 16, 64, generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.mse_loss(output, target)
