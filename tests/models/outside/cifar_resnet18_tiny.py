"""kuangliu/pytorch-cifar's models/resnet.py (pytorch_cifar/models/, unchanged, with the package
it sits in) as its main.py builds it: `net = ResNet18()` (11M parameters: the widths 64..512 are
fixed in the file, and `F.avg_pool2d(out, 4)` fixes 32 x 32 images), trained with
`nn.CrossEntropyLoss()` (cifar_common.py). BatchNorm2d in training mode (batch statistics, running
stats updated in forward), BasicBlock's shortcut an empty nn.Sequential or conv+BN, an in-place
residual add `out += self.shortcut(x)`, `out.view(out.size(0), -1)` before the classifier."""

import torch

from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import ResNet18


def build_model():
    torch.manual_seed(0)
    return ResNet18()
