"""A decoder whose sinusoidal position table (a buffer) is read with `narrow`, a spelling context
parallelism does not rewrite: each rank would add positions 0.. of its own shard, so --cp must refuse
it rather than train something else.

    graphsplit run tests/models/narrow_positions.py --cp 2     # refused in one line
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, SEQ = 64, 32, 2, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        position = torch.arange(SEQ).unsqueeze(1)
        scale = torch.exp(torch.arange(0, DIM, 2) * (-math.log(10000.0) / DIM))
        table = torch.zeros(SEQ, DIM)
        table[:, 0::2], table[:, 1::2] = torch.sin(position * scale), torch.cos(position * scale)
        self.register_buffer("table", table, persistent=False)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.table.narrow(0, 0, T)
        q, k, v = (t.view(B, T, HEADS, DIM // HEADS).transpose(1, 2) for t in self.qkv(x).split(DIM, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, DIM)
        return self.head(x + y)


def build_model():
    return Model()


def example_inputs():
    return (torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0)),)
