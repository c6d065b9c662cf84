"""A token tagger trained on losses written by hand, as training scripts write them: sums over every
token and the batch (`.sum()`, a summed MSE, a boolean mask's selection summed), a sum divided by a
constant or by the batch's size read from a tensor, the mean of the batch's tokens. tests/test_summed_losses.py
swaps loss_fn (and the target, flattened to batch x length as seq2seq scripts feed it)."""

import torch
import torch.nn as nn

BATCH, LENGTH, FEATURES, CLASSES = 8, 5, 6, 4


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                                 nn.Linear(16, CLASSES))

    def forward(self, x):
        return self.net(x)  # [batch, length, classes]


def build_model():
    torch.manual_seed(0)
    return Tagger()


def example_inputs():
    return (torch.randn(BATCH, LENGTH, FEATURES, generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randn(BATCH, LENGTH, CLASSES, generator=torch.Generator().manual_seed(2))


def loss_fn(out, y):
    return ((out - y) ** 2).sum()
