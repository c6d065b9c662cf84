"""kuangliu/pytorch-cifar's models/senet.py (pytorch_cifar/models/, unchanged) as its main.py
builds it: `net = SENet18()` (11.3M parameters: the widths 64..512 are fixed in the file), trained
with `nn.CrossEntropyLoss()` (cifar_setup.py). Pre-activation blocks with squeeze-excitation: a
global `F.avg_pool2d(out, out.size(2))` (kernel size read from the tensor), two 1x1 convs as the
excitation MLP, `F.sigmoid`, a broadcast channel scaling `out * w`, and an in-place residual
`out += shortcut` where the shortcut is the input itself or a conv chosen by
`hasattr(self, 'shortcut')`; BatchNorm2d in training mode, `view` before the classifier."""

import torch
from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import SENet18


def build_model():
    torch.manual_seed(0)
    return SENet18()
