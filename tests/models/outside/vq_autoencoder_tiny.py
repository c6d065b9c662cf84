"""lucidrains/vector-quantize-pytorch's VectorQuantize (vector_quantize_pytorch/, the package laid flat
and unchanged; its __init__ imports every quantizer, and they import einops and einx) in the small
conv autoencoder of its examples/autoencoder.py, built and trained as that script does:

    model = SimpleVQAutoEncoder(dim = 32, codebook_size = 256, rotation_trick = True,
                                straight_through = False, directional_reparam = False)
    out, indices, cmt_loss = model(x)
    out = out.clamp(-1., 1.)
    rec_loss = (out - x).abs().mean()
    (rec_loss + alpha * cmt_loss).backward()          # alpha = 10

examples/autoencoder.py cannot be imported (torchvision, tqdm and fire at its top: FashionMNIST through
torchvision), so SimpleVQAutoEncoder below is its function, copied; it builds the package's own
`Sequential` around the unchanged VectorQuantize. The batches are FashionMNIST-shaped (1 x 28 x 28,
normalized to [-1, 1] as its transform does), drawn from a seeded generator.

What it exercises: a codebook held in buffers and updated *in forward* while training (the EMA:
`cluster_size` and `embed_avg` lerped in place through `.data`, `embed` overwritten by `.data.copy_`),
so each micro-batch moves the codebook the next one reads, where the untouched model moves it once
on the whole batch; nearest-code search by a hand-written cdist (einops reduce/rearrange), argmax and
`F.one_hot` in forward, the rotation trick (the repository's default gradient path through the
quantizer, in place of the plain straight-through `x + (q - x).detach()`: a Householder-style
rotation with detached factors), an MSE commitment loss returned as the third output and added by
the training loop, `accept_image_fmap` rearranges (b c h w <-> b (h w) c), a Sequential that unpacks
the quantizer's tuple, `torch.tensor(0., requires_grad=self.training)` made in forward, and
`is_distributed()` read at construction (`sync_codebook` all-reduces the EMA statistics when a
process group of more than one rank exists)."""

import torch
import torch.nn as nn
from vector_quantize_pytorch import Sequential, VectorQuantize

BATCH, ALPHA = 8, 10  # examples/autoencoder.py's alpha


def SimpleVQAutoEncoder(dim=32, **vq_kwargs):  # examples/autoencoder.py's name
    return Sequential(
        nn.Conv2d(1, 16, kernel_size=3, stride=1, padding=1),
        nn.MaxPool2d(kernel_size=2, stride=2),
        nn.GELU(),
        nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1),
        nn.MaxPool2d(kernel_size=2, stride=2),
        VectorQuantize(dim=dim, accept_image_fmap=True, **vq_kwargs),
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(32, 16, kernel_size=3, stride=1, padding=1),
        nn.GELU(),
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(16, 1, kernel_size=3, stride=1, padding=1),
    )


def build_model():
    torch.random.manual_seed(1234)  # train()'s seed
    return SimpleVQAutoEncoder(dim=32, codebook_size=256, rotation_trick=True, straight_through=False,
                               directional_reparam=False)


def _images():
    g = torch.Generator().manual_seed(1)
    return torch.rand(BATCH, 1, 28, 28, generator=g) * 2 - 1  # ToTensor then Normalize((0.5,), (0.5,))


def example_inputs():
    return (_images(),)


def example_target():
    return _images()


def loss_fn(output, x):
    out, indices, cmt_loss = output
    out = out.clamp(-1.0, 1.0)
    rec_loss = (out - x).abs().mean()
    return rec_loss + ALPHA * cmt_loss
