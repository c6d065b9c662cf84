"""A small ResNet: convolutions, BatchNorm and residual connections.

BatchNorm sees micro-batches under a pipeline; `graphsplit run --check` runs
the reference on the same micro-batches, so the statistics match.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), blocks_per_stage: int = 2, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers = []
        c_in = widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks_per_stage):
                layers.append(BasicBlock(c_in, w, stride=2 if (i > 0 and j == 0) else 1))
                c_in = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def build_model():
    return ResNet()


def example_inputs():
    return (torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(1))


def loss_fn(logits, target):
    return F.cross_entropy(logits, target)
