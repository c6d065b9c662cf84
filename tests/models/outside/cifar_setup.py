"""What kuangliu/pytorch-cifar's main.py does around the model (ours, shared by the cifar_*_tiny.py
files): CIFAR-10-shaped batches (3 x 32 x 32, 10 classes, normalized as its transform_train
does, here drawn from a seeded generator) and `criterion = nn.CrossEntropyLoss()`;
`loss = criterion(net(inputs), targets)`."""

import torch
import torch.nn as nn

BATCH, CLASSES = 8, 10


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def example_inputs():
    return (_data()[0],)


def example_target():
    return _data()[1]


def loss_fn(outputs, targets):
    return nn.CrossEntropyLoss()(outputs, targets)
