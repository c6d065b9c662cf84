import torch
import torch.nn as nn


class IntOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return y, y.shape[0]  # a Python int in the output


def build_model():
    return IntOut()


def example_inputs():
    return (torch.randn(4, 4),)
