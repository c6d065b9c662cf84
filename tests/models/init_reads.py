"""A model whose init code reads one parameter to set another: a rank cannot drop the tensors it does
not hold while the constructor runs, so `run` builds it once and the ranks slice it."""

import torch
import torch.nn as nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight.t())  # reads a.weight

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def build_model():
    return Tied()


def example_inputs():
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),)
