"""A model file whose loss needs nothing but the output: `loss_fn(output)`, no example_target()."""

import torch
import torch.nn as nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def example_inputs():
    return (torch.randn(8, 8),)


def loss_fn(output):
    return (output - 0.5).abs().mean()  # a mean over the batch: micro-batches of equal size average to it
