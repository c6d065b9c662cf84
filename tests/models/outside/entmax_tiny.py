"""deep-spin/entmax's entmax/ (activations.py, root_finding.py, losses.py, __init__.py, unchanged): its
sparse attention and its loss, in a small two-layer attention classifier of ours (the model file is
ours: entmax ships functions, not a model). Attention probabilities are 1.5-entmax in the first
layer and sparsemax in the second (`Entmax15(dim=-1)`, `Sparsemax(dim=-1)`: each a
torch.autograd.Function with its own backward, over a full sort, a cumsum and a gather of the
threshold), and the loss is `Entmax15Loss` (another Function: its forward projects, scatters -1 at
the target and returns per-sample losses; its backward is the saved projection), summed and divided
by the batch size as entmax's `_GenericLoss` does. As the entmax README uses them:
`entmax15(scores, dim=-1)` in place of softmax, `Entmax15Loss()(logits, labels)` in place of
cross-entropy."""

import math

import torch
import torch.nn as nn
from entmax import Entmax15, Entmax15Loss, Sparsemax

VOCAB, BATCH, SEQ, DIM, CLASSES = 64, 4, 12, 32, 10


class SparseAttention(nn.Module):
    def __init__(self, dim, heads, normalizer):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.normalizer = normalizer  # entmax's module in place of softmax

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p = self.normalizer(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads))
        return x + self.proj((p @ v).transpose(1, 2).reshape(b, t, d))


class SparseAttentionClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.layers = nn.Sequential(SparseAttention(DIM, 4, Entmax15(dim=-1)), SparseAttention(DIM, 4, Sparsemax(dim=-1)))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        return self.head(self.layers(self.embed(tokens) + self.pos).mean(dim=1))


def build_model():
    torch.manual_seed(0)
    return SparseAttentionClassifier()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),)


def example_target():
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, CLASSES, (BATCH,), generator=g)


_entmax15_loss = Entmax15Loss()  # k=100 (a full sort over 10 classes), reduction "elementwise_mean"


def loss_fn(output, target):
    return _entmax15_loss(output, target)
