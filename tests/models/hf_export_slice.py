"""Minimal repro: under torch.export, `x[..., :n]` is `aten.slice.Tensor`, which
op_kinds.tp_family calls "unknown", so HF Llama's attention (rotate_half in RoPE,
repeat_kv) is left replicated: q/k/v/o_proj get 'its sharded output would be gathered
before any row-parallel layer'. Under fx the same code is `operator.getitem` and shards.

    graphsplit transform tests/models/hf_export_slice.py --tp 2 --json                  # export: q, o replicated
    GS_FX=1 graphsplit transform tests/models/hf_export_slice.py --tp 2 --json           # fx: q, o sharded
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

C, H = 32, 4
D = C // H


def rotate_half(x):
    return torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)


class SliceAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(C, C, bias=False)
        self.o = nn.Linear(C, C, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, H, D).transpose(1, 2)
        q = q + rotate_half(q)
        y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class SliceAttnKw(SliceAttn):
    def forward(self, x, **kwargs):  # **kwargs, as in every HF forward: fx is refused, export used
        return super().forward(x)


def build_model():
    return SliceAttn() if os.environ.get("GS_FX") else SliceAttnKw()


def example_inputs():
    return (torch.randn(4, 8, C, generator=torch.Generator().manual_seed(0)),)
