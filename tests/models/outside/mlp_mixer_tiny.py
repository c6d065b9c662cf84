"""lucidrains/mlp-mixer-pytorch's MLPMixer (mlp_mixer_pytorch/, the package laid flat and unchanged: its
__init__ imports `mlp_mixer_pytorch.*`) at a tiny size, called as its README does:

    model = MLPMixer(image_size = 256, channels = 3, patch_size = 16, dim = 512, depth = 12, num_classes = 1000)
    pred = model(img)  # (1, 1000)

and trained with cross-entropy on class labels (the repo has no training script). Exercises: MLPMixer is a
function returning one flat nn.Sequential (no forward of its own): einops `Rearrange` patchify layer, token
mixing by `nn.Conv1d(kernel_size=1)` over the patch axis (chan_first) and channel mixing by nn.Linear
(chan_last), PreNormResidual blocks, einops `Reduce('b n c -> b c', 'mean')`. 16x16 images, patch 4
(16 patches), dim 32, depth 4, 10 classes; dropout 0 (its default)."""

import torch
import torch.nn.functional as F
from mlp_mixer_pytorch.mlp_mixer_pytorch import MLPMixer

BATCH, IMAGE, CLASSES = 8, 16, 10


def build_model():
    torch.manual_seed(0)
    return MLPMixer(image_size=IMAGE, channels=3, patch_size=4, dim=32, depth=4, num_classes=CLASSES)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),)


def example_target():
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, CLASSES, (BATCH,), generator=g)


def loss_fn(pred, labels):
    return F.cross_entropy(pred, labels)
