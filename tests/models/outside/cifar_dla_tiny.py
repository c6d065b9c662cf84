"""kuangliu/pytorch-cifar's models/dla.py (pytorch_cifar/models/, unchanged) built as `net = DLA()`
(the "DLA" of its README's accuracy table; main.py's default is the SimpleDLA of dla_simple.py;
16.3M parameters: the widths 16..512 are fixed in the file), trained with `nn.CrossEntropyLoss()`
(cifar_setup.py). Deep layer aggregation: Tree modules whose Root concatenates (`torch.cat(xs, 1)`)
the outputs of a prev_root block, of nested sub-Trees (stored and fetched by name through
`__setattr__` / `__getattr__('level_%d' % i)`) and of a left and right BasicBlock, then 1x1 conv +
BatchNorm2d; residual BasicBlocks with an in-place `out += self.shortcut(x)`, BatchNorm2d in
training mode, `F.avg_pool2d(out, 4)` and `view` before the classifier."""

import torch
from cifar_setup import example_inputs, example_target, loss_fn  # noqa: F401
from pytorch_cifar.models import DLA


def build_model():
    torch.manual_seed(0)
    return DLA()
