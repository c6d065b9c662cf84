"""A model file that draws from the global generators without a seed anywhere: its batch and
target from torch's, its hidden width from Python's `random` and an output order from NumPy's
(Time-Series-Library picks FEDformer's Fourier modes so). Every process must build the same."""

import random

import numpy as np
import torch
import torch.nn as nn


class Unseeded(nn.Module):
    def __init__(self):
        super().__init__()
        hidden = random.choice([12, 16, 20, 24])
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 16), nn.ReLU(), nn.Linear(16, 4))
        self.register_buffer("order", torch.as_tensor(np.random.permutation(4)))

    def forward(self, x):
        return self.net(x)[:, self.order]


def build_model():
    return Unseeded()


def example_inputs():
    return (torch.randn(4, 8),)


def example_target():
    return torch.randn(4, 4)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()
