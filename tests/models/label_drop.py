"""Class-label dropout as DiT's LabelEmbedder does it: `torch.rand(B) < p` in training picks the
labels replaced by the null class. The draw is part of what the model computes."""

import torch
import torch.nn as nn


class LabelDrop(nn.Module):
    def __init__(self, classes=10, dim=16, prob=0.5):
        super().__init__()
        self.table = nn.Embedding(classes + 1, dim)  # the last row: the null class
        self.classes, self.prob = classes, prob

    def forward(self, labels):
        if self.training:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.prob
            labels = torch.where(drop, self.classes, labels)
        return self.table(labels)


class Conditioned(nn.Module):
    def __init__(self):
        super().__init__()
        self.y_embedder = LabelDrop()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x, labels):
        return self.b(torch.relu(self.a(x + self.y_embedder(labels))))


def build_model():
    return Conditioned()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(8, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
