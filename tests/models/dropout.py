"""Dropout draws different random masks in the pipeline and in the reference: --check compares them
with dropout off (p=0) on both sides, and says so."""

import torch
import torch.nn as nn


class Dropped(nn.Module):
    # dropout in both halves: each pipeline rank draws from its own generator, while the reference
    # draws the second half's masks after the first half's, so they cannot agree
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.b = nn.Linear(8, 8)
        self.drop2 = nn.Dropout(0.5)
        self.c = nn.Linear(8, 8)

    def forward(self, x):
        return self.c(self.drop2(torch.relu(self.b(self.drop(torch.relu(self.a(x)))))))


def build_model():
    return Dropped()


def example_inputs():
    return (torch.randn(8, 8, generator=torch.Generator().manual_seed(0)),)
