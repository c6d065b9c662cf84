"""A model that validates its inputs' values, as libraries do (HF's CTC heads: `if labels is not None and
labels.max() >= self.config.vocab_size: raise ValueError(...)`): an `if ...: raise` with `and`, one with
`or`, and an `assert` on values. None of them changes what the model computes; each must still raise
on bad data.

    build_model          traced by torch.fx
    build_keyword_model  the same behind `forward(..., **kwargs)`: traced by torch.export
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 32


class Checked(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.l1 = nn.Linear(16, 16)
        self.l2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, idx, labels=None):
        if labels is not None and labels.max() >= VOCAB:
            raise ValueError(f"Label values must be < vocab_size: {VOCAB}")
        if idx.min() < 0 or idx.max() >= VOCAB:
            raise IndexError("token ids out of range")
        h = self.emb(idx)
        assert torch.isfinite(h).all(), "the embedding went non-finite"
        logits = self.head(self.l2(torch.relu(self.l1(h))))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))


class KeywordChecked(Checked):
    def forward(self, idx, labels=None, **kwargs):
        return super().forward(idx, labels)


def build_model():
    torch.manual_seed(0)
    return Checked()


def build_keyword_model():
    torch.manual_seed(0)
    return KeywordChecked()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return {"idx": torch.randint(0, VOCAB, (4, 8), generator=g), "labels": torch.randint(0, VOCAB, (4, 8), generator=g)}
