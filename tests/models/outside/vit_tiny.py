"""lucidrains/vit-pytorch's vit_pytorch/vit.py (vit_pytorch_repo/vit_pytorch/, unchanged; only the
files used are copied, so `vit_pytorch` is a namespace package here: the repository's __init__.py
imports dino.py, which needs torchvision) at a tiny size, called as its README does
(`preds = v(img)`) and trained as its train_vit_decorr.py trains a ViT: `F.cross_entropy(logits, labels)`.
Patches by an einops `Rearrange` layer, LayerNorm before and after the patch projection, a cls token
expanded with einops `repeat` and concatenated, a learned positional embedding sliced to the sequence
(`self.pos_embedding[:seq]`), pre-norm attention with fused to_qkv + chunk + rearrange, a final LayerNorm,
and cls pooling `x[:, 0]`; dropout 0."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "vit_pytorch_repo"))
from vit_pytorch.vit import ViT  # noqa: E402

BATCH, CLASSES = 8, 10


def build_model():
    torch.manual_seed(0)
    return ViT(image_size=32, patch_size=8, num_classes=CLASSES, dim=32, depth=4, heads=4, dim_head=8,
               mlp_dim=64, dropout=0.0, emb_dropout=0.0)


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def example_inputs():
    return (_data()[0],)


def example_target():
    return _data()[1]


def loss_fn(logits, labels):
    return F.cross_entropy(logits, labels)
