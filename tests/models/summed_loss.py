"""A classifier trained on a cross-entropy summed over the batch (`reduction='sum'`, as older seq2seq
code sums its token losses and divides later), with class weights in the model's own loss module: each
piece of the batch sums its own samples, and the whole batch's loss is the sum of the pieces'."""

import torch
import torch.nn as nn

BATCH, FEATURES, CLASSES = 8, 6, 5


class Summed(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.criterion = nn.CrossEntropyLoss(weight=torch.linspace(0.5, 1.5, CLASSES), reduction="sum")

    def forward(self, x, labels):
        return self.criterion(self.net(x), labels)


def build_model():
    torch.manual_seed(0)
    return Summed()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
