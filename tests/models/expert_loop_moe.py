"""A mixture of experts whose experts are an `nn.ModuleList` called one by one, each on the tokens it
picked, as tutorials and research code write it (here with `nonzero` and `index_add_`, each expert an
`nn.Sequential`, and a shared expert every token goes through), in a small decoder. fx follows it (no
branch on the data), so `--ep` places the experts on ranks (passes/expert_loops.py).

    build_model           top-2 routing over 4 experts
    build_in_place_model  the tokens updated in place expert after expert: the experts' calls
                          cannot be gathered into one exchange (refused under --ep)
    build_mixing_model    experts with BatchNorm, statistics over the tokens each got: not row by row
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HIDDEN, EXPERTS, BATCH, SEQ = 32, 16, 24, 4, 4, 6


class MoE(nn.Module):
    def __init__(self, mode="plain"):
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        norm = nn.BatchNorm1d if mode == "mixing" else nn.Identity  # BatchNorm: statistics over the rows
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, HIDDEN), norm(HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))
                                     for _ in range(EXPERTS))
        self.shared = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, DIM))
        self.mode = mode

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(2, dim=-1)
        out = self.shared(flat)
        if self.mode == "in_place":
            flat = flat.clone()
        for e, expert in enumerate(self.experts):
            hit = chosen == e
            tokens = hit.any(-1).nonzero().squeeze(-1)
            rows = flat[tokens]
            y = expert(rows) * (weights * hit).sum(-1, keepdim=True)[tokens]
            if self.mode == "in_place":
                flat[tokens] = flat[tokens] + 0.5 * y  # the next expert reads the tokens this one wrote
            out.index_add_(0, tokens, y)
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.moe = MoE(mode)

    def forward(self, x):
        x = x + self.mix(self.norm1(x)).cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]
        return x + self.moe(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, mode="plain"):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(mode) for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build_model():
    torch.manual_seed(0)
    return Decoder()


def build_in_place_model():
    torch.manual_seed(0)
    return Decoder("in_place")


def build_mixing_model():
    torch.manual_seed(0)
    return Decoder("mixing")


def _data():
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))


def example_inputs():
    return (_data()[:, :-1].clone(),)


def example_target():
    return _data()[:, 1:].clone()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
