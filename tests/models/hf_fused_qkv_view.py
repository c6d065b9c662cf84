"""Minimal repro: HF GPT-2's fused QKV (Conv1D) is column-sharded without chunks, then gathered.

HF's Conv1D computes `addmm(b, x.view(-1, nx), W).view(B, T, 3C)` and the attention then
`.split(C, dim=2)`. tensor_parallel._chunk_layout only recognizes a split that is the
linear's *direct* user, so the view in between hides it: the weight gets a plain S(1)
(not chunk-wise), the split along the sharded dim gathers q, k, v, and attention and
c_proj run replicated (left_replicated: 'split ... splits along the sharded dim').

    graphsplit transform tests/models/hf_fused_qkv_view.py --tp 2 --json
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

C, H = 32, 4


class FusedQKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.w_attn = nn.Parameter(torch.randn(C, 3 * C) * 0.02)  # Conv1D layout: (in, out)
        self.b_attn = nn.Parameter(torch.zeros(3 * C))
        self.proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, _ = x.shape
        qkv = torch.addmm(self.b_attn, x.view(-1, C), self.w_attn).view(B, T, 3 * C)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def build_model():
    return FusedQKV()


def example_inputs():
    return (torch.randn(4, 8, C, generator=torch.Generator().manual_seed(0)),)
