"""A tensor made by a factory call and filled in place over several layers (FEDformer fills a
complex zeros tensor mode by mode): the storage the writes land in must be computed once, on the
stage that starts writing, and sent; a stage that recomputed `torch.zeros` would miss the writes
made before the cut. FILLED_TRACER=export puts an `int()` of a size in front, so torch.export
traces it (aten `copy_` on selects) instead of torch.fx (`operator.setitem`). A shared block (one
module reached under two names) is part of it: the export path must leave its parameters as built."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SLOTS, WIDTH, BATCH = 6, 8, 4


class Filler(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.slots = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(SLOTS))
        self.shared = nn.Linear(WIDTH, WIDTH)
        self.twice = nn.ModuleList([self.shared, self.shared])  # one block, two names
        self.out = nn.Linear(SLOTS * WIDTH, WIDTH)

    def forward(self, x):
        if os.environ.get("FILLED_TRACER") == "export":
            x = x[:, : int(x.size(1))]  # fx cannot take int() of a size: torch.export traces this
        h = torch.tanh(self.inp(x))
        filled = x.new_zeros(x.size(0), SLOTS, WIDTH)
        for i, slot in enumerate(self.slots):
            filled[:, i].copy_(torch.tanh(slot(h)))  # fx cannot trace `filled[:, i] = ...`
            h = h + filled[:, i]
        for block in self.twice:
            h = h + block(h)
        return self.out(filled.flatten(1)) + h


def build_model():
    torch.manual_seed(0)
    return Filler()


def example_inputs():
    return (torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(2))


def loss_fn(output, target):
    return F.mse_loss(output, target)
