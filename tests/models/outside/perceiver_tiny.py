"""lucidrains/perceiver-pytorch's PerceiverLM (perceiver_repo/perceiver_pytorch/, unchanged) at a tiny size,
called as its README calls it (`logits = model(seq, mask = mask)`, here without a mask) and trained on the
next token: token and learned position embeddings, one cross-attention from latents to the tokens, latent
self-attention over einops' merged `(b h) n d` heads with `einsum('b i d, b j d -> b i j')`, and a decoder
cross-attention from the tokens back to the latents."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "perceiver_repo"))
from perceiver_pytorch import PerceiverLM  # noqa: E402

BATCH, SEQ, VOCAB = 4, 16, 64


def build_model():
    torch.manual_seed(0)
    return PerceiverLM(num_tokens=VOCAB, dim=32, depth=2, max_seq_len=SEQ, num_latents=8, latent_dim=32,
                       cross_heads=1, latent_heads=4, cross_dim_head=8, latent_dim_head=8)


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
