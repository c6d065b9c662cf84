"""A model whose gradients overflow fp16 at the default loss scale (2**16) for the first steps:
the loss scaler must skip those steps on every rank and halve the scale until they fit."""

import torch
import torch.nn as nn


class Wide(nn.Module):
    def __init__(self, width: int = 32, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def build_model():
    return Wide()


def example_inputs():
    return (torch.randn(8, 32, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.zeros(8, 32)


def loss_fn(out, target):
    # a large loss: d loss / d out ~ 2.5 per element, x 2**16 is beyond fp16's 65504
    return 10.0 * (out - target).square().sum(dim=1).mean()
