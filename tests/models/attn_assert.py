"""nanoGPT-style attention whose only obstacle to torch.fx is an `assert` on the sequence length
(graphsplit issue 21). `build_exported` asserts on `int(t)`, which fx cannot evaluate either way, so
it goes through torch.export: there its `.contiguous()` after SDPA leaves no trace (SDPA's output
was already contiguous on CPU), and the `.view` after it relies on the strides that kernel returned."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(y.transpose(1, 2).contiguous().view(B, T, C))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Attn() for _ in range(4))

    def forward(self, x):
        b, t, c = x.size()
        assert t <= 64, "too long"
        for blk in self.blocks:
            x = blk(x)
        return x


class NetInt(Net):
    def forward(self, x):
        assert int(x.size(1)) <= 64, "too long"
        for blk in self.blocks:
            x = blk(x)
        return x


def build_model():
    torch.manual_seed(0)
    return Net()


def build_exported():
    torch.manual_seed(0)
    return NetInt()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(4, 16, 32, generator=g),)
