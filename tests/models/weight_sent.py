"""A stage (pos) that computes a value from its weight alone (a position embedding of arange) and
sends it to the next: under torch's split backward (zero-bubble schedules) that weight's gradient
would arrive only through the send, which the weight backward never follows."""

import torch
import torch.nn as nn


class WeightSent(nn.Module):
    def __init__(self, width: int = 16, length: int = 8):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.pos = nn.Embedding(length, width)
        self.mid = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        h = self.inp(x)
        p = self.pos(torch.arange(x.shape[1], device=x.device))
        h = self.mid(h)
        return self.out(h + p)


def build_model():
    return WeightSent()


def example_inputs():
    return (torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0)),)
