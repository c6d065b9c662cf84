"""lucidrains/vit-pytorch's vit_pytorch/mae.py with the ViT of vit_pytorch/vit.py as its encoder
(vit_pytorch_repo/vit_pytorch/, unchanged) at a tiny size, trained as its README does:
`loss = mae(images)`, `loss.backward()`: the model returns its own reconstruction loss.
pool='mean' for the encoder (with the default 'cls', mae.py slices the now 2-D `pos_embedding` as
`[:, 1:(num_patches + 1)]` and fails eagerly at this commit).

What it exercises: random masking drawn in forward (`torch.rand(batch, num_patches).argsort(-1)`,
75% of the patches masked): a random op whose draw depends on the batch size, so a batch cut in
pieces draws other masks than the whole batch; advanced indexing with a `batch_range` column
(`tokens[batch_range, unmasked_indices]`), index assignment into a fresh zeros tensor
(`decoder_tokens[batch_range, masked_indices] = mask_tokens`), an in-place `tokens += pos_embedding`,
an nn.Embedding read with computed indices, the encoder's submodules reused piecewise
(`encoder.to_patch_embedding[0]`, `encoder.transformer`), an MSE loss inside the model."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent / "vit_pytorch_repo"))
from vit_pytorch.mae import MAE  # noqa: E402
from vit_pytorch.vit import ViT  # noqa: E402

BATCH = 8


def build_model():
    torch.manual_seed(0)
    v = ViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, dim_head=8, mlp_dim=64,
            pool='mean')
    return MAE(encoder=v, masking_ratio=0.75, decoder_dim=32, decoder_depth=1, decoder_heads=4, decoder_dim_head=8)


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 3, 32, 32, generator=g),)
