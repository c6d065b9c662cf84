"""A stage cut after a LayerNorm whose output also feeds a linear of the same stage: the tensor the
second stage sends (of inp | norm, first | second | out) is one its own backward saved (zero-bubble schedules detach sent tensors in place)."""

import torch
import torch.nn as nn


class SentAndSaved(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.first = nn.Linear(width, width)
        self.second = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        normed = self.norm(self.inp(x))
        return self.out(self.second(self.first(normed)) + normed)


def build_model():
    return SentAndSaved()


def example_inputs():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(0)),)
