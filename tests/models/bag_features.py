"""A click model over categorical features as recommendation models feed them: per table, one category
index per sample in a flat `indices` tensor and `offsets = arange(batch)` (each bag one index), looked up
by `nn.EmbeddingBag(mode="sum")` with the offsets, beside dense features. The offsets are positions in
the whole batch's indices."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, DENSE, TABLES, ROWS, DIM = 8, 5, 2, 20, 8


class BagFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.bags = nn.ModuleList([nn.EmbeddingBag(ROWS, DIM, mode="sum") for _ in range(TABLES)])
        self.dense = nn.Linear(DENSE, DIM)
        self.top = nn.Sequential(nn.Linear(DIM * (TABLES + 1), 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, indices, offsets):
        looked_up = [bag(indices[t], offsets[t]) for t, bag in enumerate(self.bags)]
        return self.top(torch.cat([self.dense(dense), *looked_up], dim=1))


def build_model():
    torch.manual_seed(0)
    return BagFeatures()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, DENSE, generator=g), torch.randint(0, ROWS, (TABLES, BATCH), generator=g),
            torch.arange(BATCH).repeat(TABLES, 1))


def example_target():
    return torch.randint(0, 2, (BATCH, 1), generator=torch.Generator().manual_seed(2)).float()


def loss_fn(output, target):
    return F.binary_cross_entropy_with_logits(output, target)
