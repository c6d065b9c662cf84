"""A small GPT whose Python branches read sizes known from the example inputs, as models written
without a tracer in mind do: an `assert` on the sequence length, an `if` on it inside every block
(SDPA only when there is more than one token), an `assert` on parameter sizes, and an `if` on the
batch size. torch.fx decides each on the example inputs and keeps it as a check in the graph
(graphsplit/ir/size_conditions.py); the batch condition holds for micro-batches of 2 or more."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, HEADS, BATCH, SEQ = 64, 32, 4, 4, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, idx):
        # the whole weight's size, under tp too
        assert self.qkv.weight.size(0) == 3 * D, "fused qkv"
        B, T, C = x.size()
        q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        if idx.size(1) > 1:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # one token attends to itself only
            y = v
        x = x + self.o(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        b, t = idx.size()
        assert t <= 64, "too long"
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x, idx)
        if b >= 2:
            x = x * 0.5
        return self.head(x)


def build_model():
    torch.manual_seed(0)
    return Net()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)
