"""kuangliu/pytorch-cifar's models/regnet.py (pytorch_cifar/models/, unchanged) as its main.py
builds it: `net = RegNetX_200MF()` (2.3M parameters, its fixed configuration; an X model, so
`se_ratio` 0 and no squeeze-excitation), trained with `nn.CrossEntropyLoss()` (cifar_setup.py).
Bottleneck blocks with grouped 3x3 convolutions (`groups=w_b // group_width`, group width 8),
BatchNorm2d in training mode, a projection shortcut where stride or width change and an in-place
residual `out += self.shortcut(x)`, `F.adaptive_avg_pool2d(out, (1, 1))` and `view` before the
classifier."""

import torch
from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import RegNetX_200MF


def build_model():
    torch.manual_seed(0)
    return RegNetX_200MF()
