"""A mixture of experts whose experts are stacked weights gathered per token by its expert id, as simple
MoE code writes it: `self.w1[ids]` (one `[d, h]` matrix per token) through `torch.bmm`, a per-expert bias
`self.b1[ids]`, the second matrix through an einsum; top-1 routing, the router's probability scaling each
token's output. In a small decoder; `--ep` places the stacked weights in slices (passes/expert_gathers.py).

    build_model         as above
    build_whole_read_model  also a penalty on the whole stacked weight (`self.w1.pow(2).mean()`): it
                            cannot be held in slices
    build_first_read_model  also a penalty on its first expert's matrix (`self.w1[0]`): no rank's
                            slice holds expert 0 alone
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HIDDEN, EXPERTS, BATCH, SEQ = 32, 16, 24, 4, 4, 6


class GatheredMoE(nn.Module):
    def __init__(self, penalty=False):
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        self.w1 = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) / DIM**0.5)
        self.b1 = nn.Parameter(torch.zeros(EXPERTS, HIDDEN))
        self.w2 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) / HIDDEN**0.5)
        self.penalty = penalty

    def forward(self, x):
        flat = x.reshape(-1, DIM)
        probs = self.router(flat).softmax(-1)
        weight, ids = probs.max(-1)
        h = torch.bmm(flat.unsqueeze(1), self.w1[ids]).squeeze(1) + self.b1[ids]
        y = torch.einsum("nh,nhd->nd", F.gelu(h), self.w2[ids])
        if self.penalty:
            y = y + 1e-3 * (self.w1 if self.penalty == "whole" else self.w1[0]).pow(2).mean()
        return (y * weight[:, None]).view_as(x)


class Decoder(nn.Module):
    def __init__(self, penalty=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norms = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(2))
        self.mixes = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(2))
        self.moes = nn.ModuleList(GatheredMoE(penalty) for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        for norm, mix, moe in zip(self.norms, self.mixes, self.moes):
            h = h + mix(h).cumsum(1) / torch.arange(1, h.shape[1] + 1, device=h.device)[:, None]
            h = h + moe(norm(h))
        return self.head(h)


def build_model():
    torch.manual_seed(0)
    return Decoder()


def build_whole_read_model():
    torch.manual_seed(0)
    return Decoder(penalty="whole")


def build_first_read_model():
    torch.manual_seed(0)
    return Decoder(penalty="first")


def _data():
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))


def example_inputs():
    return (_data()[:, :-1].clone(),)


def example_target():
    return _data()[:, 1:].clone()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
