"""kuangliu/pytorch-cifar's models/shufflenetv2.py (pytorch_cifar/models/, unchanged) as its main.py
builds it (`net = ShuffleNetV2(1)` there; net_size=0.5 here, its smallest configuration, 0.35M
parameters), trained with `nn.CrossEntropyLoss()` (cifar_common.py). Channel split
(`x[:, :c]`, `x[:, c:]` with c from `int(x.size(1) * ratio)`), channel shuffle
(`view(N, g, C//g, H, W).permute(0, 2, 1, 3, 4).reshape(N, C, H, W)` with N, C, H, W read from
`x.size()`), `torch.cat` of two branches, depthwise convolutions, BatchNorm2d in training mode."""

import torch

from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import ShuffleNetV2


def build_model():
    torch.manual_seed(0)
    return ShuffleNetV2(net_size=0.5)
