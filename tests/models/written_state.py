"""Two models written as libraries write them, for tests/test_einops_and_state.py.

`Mixer`: tokens moved with einops (`rearrange`, `pack` / `unpack` around a projection, `reduce`), as
lucidrains' repositories write every reshape. `EmaCentre`: features centred by a running mean kept in a
buffer and updated in forward through `.data`, after the layers that read it, with the buffer's `.grad`
read first (vector-quantize-pytorch's EMA codebook does both)."""

import torch
import torch.nn as nn
from einops import pack, rearrange, reduce, unpack

BATCH = 8


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = nn.Linear(8, 16)
        self.proj_out = nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):  # [b, c, h, w]
        tokens = rearrange(x, "b c h w -> b (h w) c")
        packed, ps = pack([tokens], "b * c")
        h = self.proj_out(self.proj_in(packed).relu())
        (h,) = unpack(h, ps, "b * c")
        return self.head(reduce(h, "b n c -> b c", "mean"))


class EmaCentre(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.mid = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.out = nn.Linear(16, 4)
        self.register_buffer("centre", torch.zeros(16))

    def forward(self, x):
        h = self.mid(self.inp(x) - self.centre)
        if self.training:
            if self.centre.grad is not None:  # a gradient some other code left on it joins the update
                h = h + self.centre.grad
            self.centre.data.lerp_(h.detach().mean(0), 0.1)
        return self.out(h)


def build_model():
    torch.manual_seed(0)
    return Mixer()


def build_ema():
    torch.manual_seed(0)
    return EmaCentre()


def example_inputs():
    return (torch.randn(BATCH, 8, 2, 2, generator=torch.Generator().manual_seed(1)),)
