"""A decoder whose attention is written out with a sliding-window mask (each token sees the 4 before
it): not the causal mask, so context parallelism (which masks by global position, causally) must
refuse it rather than cut it.

    graphsplit run tests/models/window_attention.py --cp 2     # refused in one line
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, SEQ, WINDOW = 64, 32, 2, 16, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        ones = torch.ones(SEQ, SEQ)
        self.register_buffer("window", (ones.tril() - ones.tril(-WINDOW)).view(1, 1, SEQ, SEQ), persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.qkv(x).split(DIM, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.window[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.attn = Attention()
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        return self.head(x + self.attn(x))


def build_model():
    return Model()


def example_inputs():
    return (torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0)),)
