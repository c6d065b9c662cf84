import torch
import torch.nn as nn


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:  # control flow on a tensor's value: no tracer can follow it
            y = y * 2
        return y


def build_model():
    return DataDependent()


def example_inputs():
    return (torch.randn(4, 4),)
