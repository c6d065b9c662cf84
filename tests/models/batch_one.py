"""An MLP whose example batch is a single sample: no pipeline of more than one stage can be filled."""

import torch
import torch.nn as nn


def build_model():
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(6)])


def example_inputs():
    return (torch.randn(1, 16, generator=torch.Generator().manual_seed(0)),)
