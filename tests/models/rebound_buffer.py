"""A step counter kept in a buffer and rebound in forward (`self.calls += 1`), as performer-pytorch's
ProjectionUpdater counts its calls; `REDRAW` set, forward also branches on the count (performer's redraw)."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

REDRAW = os.environ.get("REBOUND_REDRAW") == "1"


class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)
        self.register_buffer("calls", torch.tensor(0))

    def forward(self, x):
        if REDRAW and self.calls >= 1000:
            self.calls.zero_()
        self.calls += 1
        return self.out(self.mid(self.inp(x).relu()).relu())


def build_model():
    torch.manual_seed(0)
    return Counted()


def example_inputs():
    return (torch.randn(8, 8, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(1))


def loss_fn(out, target):
    return F.mse_loss(out, target)
