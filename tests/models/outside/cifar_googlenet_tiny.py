"""kuangliu/pytorch-cifar's models/googlenet.py (pytorch_cifar/models/, unchanged) as its main.py
builds it: `net = GoogLeNet()` (6.2M parameters: the widths are fixed in the file, and
`nn.AvgPool2d(8)` fixes 32 x 32 images), trained with `nn.CrossEntropyLoss()` (cifar_setup.py).
Nine Inception blocks, each four parallel branches read from one input (1x1 conv; 1x1 -> 3x3;
1x1 -> 3x3 -> 3x3; 3x3 max-pool -> 1x1) joined by `torch.cat([y1, y2, y3, y4], 1)`; convs with
bias, BatchNorm2d in training mode, in-place `nn.ReLU(True)`, a shared `nn.MaxPool2d` module
called twice, `view` before the classifier."""

import torch
from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import GoogLeNet


def build_model():
    torch.manual_seed(0)
    return GoogLeNet()
