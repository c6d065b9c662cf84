"""lukemelas/EfficientNet-PyTorch's efficientnet_pytorch/ (model.py, utils.py, __init__.py, unchanged) at
a tiny config, built as its examples/imagenet/main.py builds an untrained model
(`EfficientNet.from_name(arch, **override_params)`) and trained with its cross-entropy on the logits.
Exercises its own torch.autograd.Function (`MemoryEfficientSwish` -> `SwishImplementation.apply`,
the default activation everywhere: stem, every MBConv block, head), static "same" padding
(`Conv2dStaticSamePadding`: ZeroPad2d + conv), depthwise convs, squeeze-and-excitation (a global
average pool then a gate multiplied into the feature map), BatchNorm in training mode (statistics
over the batch), and a Python float drop-connect rate per block (0 here: its `torch.rand` mask would
make runs differ; dropout 0 too)."""

import torch
import torch.nn.functional as F
from efficientnet_pytorch import EfficientNet

BATCH, IMAGE, CLASSES = 8, 32, 10


def build_model():
    torch.manual_seed(0)
    # b0's seven stages, a quarter of its width (32 -> 8 stem channels, 1280 -> 320 head), one block
    # per stage (depth 0.1 rounds every repeat up to 1), 32x32 images
    return EfficientNet.from_name(
        "efficientnet-b0", width_coefficient=0.25, depth_coefficient=0.1, image_size=IMAGE,
        num_classes=CLASSES, dropout_rate=0.0, drop_connect_rate=0.0,
    )


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),)


def example_target():
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, CLASSES, (BATCH,), generator=g)


def loss_fn(output, target):
    return F.cross_entropy(output, target)  # main.py: criterion = nn.CrossEntropyLoss()
