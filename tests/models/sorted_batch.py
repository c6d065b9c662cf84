"""A model that sorts the examples of its batch against each other (`sort(dim=0)`): every
example's output depends on the others. Sorting rows is how a mixture of experts routes tokens
(and brings them back), so batch discovery takes dim 0 as the batch and says it assumed so; here
the assumption is wrong, and `--check` against the whole batch must say so."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        ranked = h.sort(dim=0).values  # each feature ranked over the batch
        return self.b(ranked + h)


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(8, 8, generator=torch.Generator().manual_seed(0)),)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def example_target():
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
