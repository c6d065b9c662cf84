"""A seq-first transformer (torch's nn.TransformerEncoder, batch_first=False): inputs are [T, B, C].

Cutting dim 0 cuts the sequence, not the batch: each piece attends over part of the tokens. The
untouched model on the whole batch gives another loss, so --check must fail until the batch dim is
found in the graph."""

import torch
import torch.nn as nn


def build_model():
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def example_inputs():
    return (torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(0)),)  # [T=8, B=4, C=16]


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def example_target():
    return torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(1))
