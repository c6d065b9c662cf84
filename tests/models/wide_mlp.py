"""Linears wider than fast init's tiles (256): at tp 2 a rank's block is whole tiles, so what it
draws is exactly what it holds (tests/test_fast_init.py). Built and initialized only, never trained."""

import torch
import torch.nn as nn


class WideMLP(nn.Module):
    def __init__(self, width: int = 1024):
        super().__init__()
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def build_model():
    return WideMLP()


def example_inputs():
    return (torch.randn(2, 1024),)
