"""A small MLP that trains on data: train_data() is a map-style Dataset of 40 distinct samples (5 global
batches of 8 per epoch), eval_data() an iterable of 2 whole batches. Used by tests/test_trainer.py."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

WIDTH = 8
BATCH = 8


class MLP(nn.Module):
    def __init__(self, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Pairs(Dataset):
    """Sample i: (inputs, target), each row drawn from its own seed, so every sample differs."""

    def __init__(self, n: int, offset: int = 0):
        g = torch.Generator().manual_seed(1234 + offset)
        self.x = torch.randn(n, WIDTH, generator=g)
        self.y = torch.tanh(self.x.flip(-1) * 2)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return (self.x[i],), self.y[i]


def build_model():
    return MLP()


def example_inputs():
    return (torch.zeros(BATCH, WIDTH),)


def example_target():
    return torch.zeros(BATCH, WIDTH)


def loss_fn(output, target):
    return F.mse_loss(output, target)


def train_data():
    return Pairs(40)


def eval_data():
    held_out = Pairs(2 * BATCH, offset=1)
    return [((held_out.x[i:i + BATCH],), held_out.y[i:i + BATCH]) for i in range(0, 2 * BATCH, BATCH)]
