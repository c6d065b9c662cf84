"""Tensors the model's own code makes, as hand-written models make them: a RoPE-style table and a
causal mask held as plain attributes (not registered buffers; the mask made by a method the
training script calls after construction), positions from `torch.arange(T)` in forward and a loss
whose class weights come from `torch.arange` in loss_fn, all without `device=`; and a target
with no batch dim (a 0-dim value every output is pulled towards), which goes whole to every
micro-batch."""

import torch
import torch.nn as nn

DIM, MAX_T = 16, 32


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.mid = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        # a plain attribute: building on meta would lose its values
        freqs = torch.arange(DIM) / DIM
        self.table = torch.cos(torch.arange(MAX_T)[:, None] * freqs[None, :])
        self.mask = None

    def setup_mask(self, length):
        self.mask = torch.tril(torch.ones(length, length))

    def forward(self, x):
        T = x.shape[1]
        pos = torch.arange(T)
        h = self.inp(x) + self.table[pos]
        weights = (h @ h.transpose(1, 2)) * self.mask[:T, :T] / DIM
        h = torch.relu(self.mid(weights @ h))
        return self.out(h)


def build_model():
    torch.manual_seed(0)
    model = Mixer()
    model.setup_mask(MAX_T)
    return model


def example_inputs():
    return (torch.randn(4, 8, DIM, generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.tensor(0.5)


def loss_fn(output, target):
    weights = torch.arange(1, output.shape[-1] + 1) / output.shape[-1]
    return ((output - target) ** 2 * weights).mean()
