"""Attention with one packed q/k/v projection, as `nn.MultiheadAttention` computes it (open_clip's and
OpenAI CLIP's towers, torchvision's ViT): sequence first, `in_proj` of 3E outputs unflattened to
(3, E) and picked apart q, k, v, each viewed (T, B * heads, head_dim) with the batch and the heads in
one dim, then (B, heads, T, head_dim) into scaled_dot_product_attention. Traced with torch.export
(torch.fx keeps `nn.MultiheadAttention` whole, one leaf), the module's ATen ops are what tp shards."""

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, HEADS, VOCAB, BATCH, SEQ = 32, 4, 64, 4, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class PackedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids).permute(1, 0, 2)  # NLD -> LND, as open_clip's towers
        x = self.blocks(x)
        return self.head(x.permute(1, 0, 2))


def build_model():
    torch.manual_seed(0)
    return PackedAttention()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
