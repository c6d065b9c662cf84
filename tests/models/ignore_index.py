"""A token classifier whose loss ignores padding (cross_entropy ignore_index=-100), padded unevenly:
the first half of the batch holds most of the padding.

The whole batch's loss is the mean over all counted tokens; the mean of per-micro-batch means would
weigh the tokens of a half with more padding more, so graphsplit normalizes each piece's sum by the
global count of counted tokens (passes/token_mean.py), and --check passes against the whole batch."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.mid = nn.Linear(16, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, idx):
        return self.head(torch.relu(self.mid(self.embed(idx))))


def build_model():
    return Tagger()


def example_inputs():
    return (torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(0)),)


def example_target():
    target = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(1))
    target[0, 1:] = -100  # the first two samples hold most of the padding
    target[1, 2:] = -100
    return target


def loss_fn(output, target):
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=-100)
