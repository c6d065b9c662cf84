"""A model with an input that holds no batch: position ids shared by every example, as diffusers'
Flux takes its `img_ids` ([sequence, 3], no batch dim). Cutting them along dim 0 would cut the
sequence; they must go whole to every micro-batch and replica."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.pos = nn.Linear(3, d)
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(4))
        self.out = nn.Linear(d, 1)

    def forward(self, x, ids):
        h = self.inp(x) + self.pos(ids.float())  # [B, S, d] + [S, d]
        for block in self.blocks:
            h = h + block(h)
        att = torch.softmax(h @ h.transpose(1, 2), dim=-1)  # tokens attend to each other
        return self.out(att @ h).squeeze(-1)


def build_model():
    return Net()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.zeros(8), torch.arange(8.0), torch.arange(8.0) % 3], dim=-1)  # [S=8, 3]
    return (torch.randn(4, 8, 16, generator=g), ids)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def example_target():
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
