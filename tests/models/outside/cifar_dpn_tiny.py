"""kuangliu/pytorch-cifar's models/dpn.py (pytorch_cifar/models/, unchanged) built as
`net = DPN26()` (the smallest configuration of the file; main.py's commented list names DPN92;
11.6M parameters, widths fixed in the file), trained with `nn.CrossEntropyLoss()` (cifar_setup.py).
Dual path blocks: the conv output and the shortcut are each split by channel slices
(`x[:, :d, :, :]`, `x[:, d:, :, :]`), the residual path added and the dense paths concatenated,
`torch.cat([x[:, :d] + out[:, :d], x[:, d:], out[:, d:]], 1)`, so the width grows by the dense
depth each block; grouped 3x3 convolutions (`groups=32`), BatchNorm2d in training mode,
`F.avg_pool2d(out, 4)` and `view` before the classifier."""

import torch
from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import DPN26


def build_model():
    torch.manual_seed(0)
    return DPN26()
