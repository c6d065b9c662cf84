"""Attention with a per-head RMSNorm on q and k (Qwen3, Gemma-3, minimind: `q_norm(q_proj(x).view(B, T,
heads, head_dim))`), the norm written out (`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`), as
those models write it. `ALL_HEADS` switches to OLMo-2's norm over the whole projection (every head)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, HEADS, VOCAB, BATCH, SEQ = 32, 4, 64, 2, 8
ALL_HEADS = False


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.q_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.k_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.v_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.o_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        norm = WIDTH if ALL_HEADS else self.head_dim
        self.q_norm, self.k_norm = RMSNorm(norm), RMSNorm(norm)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if ALL_HEADS:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, HEADS, self.head_dim)
        k = k.view(b, t, HEADS, self.head_dim)
        if not ALL_HEADS:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, HEADS, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, WIDTH))


class QKNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.attn = Attention()
        self.norm = RMSNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.attn(self.norm(x))
        return self.head(self.norm(x))


def build_model():
    torch.manual_seed(0)
    return QKNorm()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
