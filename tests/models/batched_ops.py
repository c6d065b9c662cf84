"""Ops with batched semantics that keep each example apart: `torch.cdist` between each example's points
and its own copy of the prototypes (a prototype classifier), and a loss that scatters each example's
target class into its own row (entmax's losses do so: `scatter_add_` along the classes)."""

import torch
import torch.nn as nn

BATCH, POINTS, DIM, PROTOS = 8, 6, 16, 5


class Prototypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(DIM, DIM)
        self.l2 = nn.Linear(DIM, DIM)
        self.protos = nn.Parameter(torch.randn(PROTOS, DIM))

    def forward(self, x):  # x [batch, points, dim]
        h = self.l2(torch.relu(self.l1(x)))
        return -torch.cdist(h, self.protos.expand(h.shape[0], PROTOS, DIM))  # [batch, points, protos]


def build_model():
    torch.manual_seed(0)
    return Prototypes()


def example_inputs():
    return (torch.randn(BATCH, POINTS, DIM, generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randint(0, PROTOS, (BATCH, POINTS), generator=torch.Generator().manual_seed(2))


def loss_fn(scores, target):
    probs = scores.softmax(-1)
    picked = torch.zeros_like(probs).scatter_add_(-1, target.unsqueeze(-1), torch.ones_like(probs))
    return ((probs - picked) ** 2).sum(-1).mean()
