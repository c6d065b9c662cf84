"""A mixture of experts written by hand, as minimind, DeepSeek's reference code and many MoE repositories
write it: a Python loop over `nn.ModuleList` experts, `if mask.any():` skipping an expert no token chose
(a branch on the data), `nonzero` picking its tokens, `index_add_` writing them back; a router one-hot
sized by `int(indexes.max()) + 1` (lucidrains' safe_one_hot); with `aux=True`, a load-balancing loss
kept in `self.aux_loss` and summed over the layers by the model afterwards, as minimind does.

    build_model      per-token routing, no balancing loss: the samples stay apart (dp, micro-batches)
    build_aux_model  with the balancing loss, a mean over every token of the batch: no batch
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HIDDEN, EXPERTS, BATCH, SEQ = 32, 16, 24, 4, 8, 6


def safe_one_hot(indexes, n):
    return F.one_hot(indexes, max(int(indexes.max()) + 1, n))[..., :n]


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class MoE(nn.Module):
    def __init__(self, aux):
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))
        self.aux = aux

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = self.router(flat).softmax(-1)
        weight, chosen = probs.topk(2, dim=-1)
        out = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            mask = chosen == i
            if mask.any():
                token = mask.any(-1).nonzero().flatten()
                w = (weight * mask).sum(-1)[token, None]
                out.index_add_(0, token, expert(flat[token]) * w)
        if self.aux:
            load = safe_one_hot(chosen[:, 0], EXPERTS).float().mean(0)
            self.aux_loss = (load * probs.mean(0)).sum() * EXPERTS
        return out.reshape(x.shape)


class Block(nn.Module):
    def __init__(self, aux):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.moe = MoE(aux)

    def forward(self, x):
        return x + self.moe(self.norm(x))


class Model(nn.Module):
    def __init__(self, aux=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(aux) for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)
        self.aux = aux

    def forward(self, idx):
        h = self.emb(idx)
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        if not self.aux:
            return logits
        return logits, sum(b.moe.aux_loss for b in self.blocks)


def build_model():
    torch.manual_seed(0)
    return Model()


def build_aux_model():
    torch.manual_seed(0)
    return Model(aux=True)


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))


def loss_fn(output, target):
    logits, aux = output if isinstance(output, tuple) else (output, 0.0)
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1)) + 0.01 * aux
