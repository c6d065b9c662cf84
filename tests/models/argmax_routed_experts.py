"""Experts that read their weights with `F.linear(x, self.w)` (a get_attr in the graph, not a module call)
in a loop over an `nn.ModuleList`, picked by `argmax` of a router's logits: the router gets no gradient at
all (argmax carries none), in the untouched model as in the program, so no rank may wait for one."""

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, EXPERTS, BATCH, SEQ, VOCAB = 8, 4, 4, 5, 16


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(DIM, DIM) * 0.3)

    def forward(self, x):
        return F.linear(F.gelu(x), self.w)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.router = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens).reshape(-1, DIM)
        ids = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            idx = (ids == i).nonzero().squeeze(-1)
            out = out.index_add(0, idx, expert(x[idx]))
        return self.head(x + out).view(tokens.shape[0], tokens.shape[1], VOCAB)


def build_model():
    torch.manual_seed(0)
    return Model()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
