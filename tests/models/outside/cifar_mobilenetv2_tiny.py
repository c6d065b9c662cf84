"""kuangliu/pytorch-cifar's models/mobilenetv2.py (pytorch_cifar/models/, unchanged) as its main.py
builds it: `net = MobileNetV2()` (2.3M parameters, its fixed CIFAR configuration), trained with
`nn.CrossEntropyLoss()` (cifar_common.py). Inverted residual blocks with depthwise convolutions
(`groups=planes`), BatchNorm2d in training mode after every conv, a residual taken only when
`self.stride == 1` (a Python branch on a constant), a projection shortcut for a changed width,
`F.avg_pool2d(out, 4)` and `view` before the classifier."""

import torch

from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import MobileNetV2


def build_model():
    torch.manual_seed(0)
    return MobileNetV2()
