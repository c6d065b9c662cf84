"""Attention written with the batch and the heads merged in one dim, as fairseq's MultiheadAttention
and the models that copied it write it: `q.contiguous().view(T, B * heads, head_dim).transpose(0, 1)`,
`torch.bmm(q, k.transpose(1, 2))`, softmax, `torch.bmm(probs, v)`, and back with
`attn.transpose(0, 1).contiguous().view(T, B, E)`. Sharded by heads, each rank holds its heads of every
example: the merged dim is sharded chunk by chunk (one chunk per example)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, HEADS, VOCAB, BATCH, SEQ = 32, 4, 64, 4, 8


class MergedHeadsAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(WIDTH, WIDTH)
        self.k_proj = nn.Linear(WIDTH, WIDTH)
        self.v_proj = nn.Linear(WIDTH, WIDTH)
        self.out_proj = nn.Linear(WIDTH, WIDTH)
        self.head_dim = WIDTH // HEADS
        self.scaling = self.head_dim ** -0.5

    def forward(self, x):  # x: (T, B, E)
        tgt_len, bsz, embed_dim = x.size()
        q = self.q_proj(x) * self.scaling
        k = self.k_proj(x)
        v = self.v_proj(x)
        q = q.contiguous().view(tgt_len, bsz * HEADS, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * HEADS, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * HEADS, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        attn_probs = F.softmax(attn_weights, dim=-1)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([MergedHeadsAttention(), MergedHeadsAttention()])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids).transpose(0, 1)
        for layer in self.layers:
            x = x + layer(self.norm(x))
        return self.head(x.transpose(0, 1))


def build_model():
    torch.manual_seed(0)
    return Net()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
