"""An embedding tied to the LM head, trained on losses other than a cross-entropy over the logits,
and the tied weight read in other spellings (issue 21, item 7). TIED_VARIANT picks one (the ranks
torchrun starts inherit it):

    TIED_VARIANT=mse graphsplit run tests/models/tied_head.py --tp 2 --check

mse          Embedding(96, 32), a linear, Linear(32, 96, bias=False) sharing the embedding's weight; MSE on logits
default      the same, no loss_fn (graphsplit trains on the mean of squares of the output)
odd          vocabulary 97 (tp pads it), MSE
scaled_ce    cross-entropy on logits scaled before the loss
matmul       the head spelled `x @ self.emb.weight.t()`, MSE
flinear      the head spelled `F.linear(x, self.emb.weight)`, no loss_fn
regularizer  the output also carries the tied weight's mean square, added to the loss
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

VARIANT = os.environ.get("TIED_VARIANT", "mse")
VOCAB = 97 if VARIANT == "odd" else 96
BATCH, SEQ, DIM = 4, 8, 32


class TiedLM(nn.Module):
    def __init__(self, variant: str = VARIANT, vocab: int = VOCAB) -> None:
        super().__init__()
        self.variant = variant
        self.emb = nn.Embedding(vocab, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        x = torch.tanh(self.mix(self.emb(idx)))
        if self.variant == "matmul":
            return x @ self.emb.weight.t()
        if self.variant == "flinear":
            return F.linear(x, self.emb.weight)
        logits = self.head(x)
        if self.variant == "regularizer":
            return logits, self.emb.weight.square().mean()
        return logits


def build_model():
    torch.manual_seed(0)
    return TiedLM()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),)


if VARIANT not in ("default", "flinear"):
    def example_target():
        g = torch.Generator().manual_seed(2)
        if VARIANT == "scaled_ce":
            return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        return torch.randn(BATCH, SEQ, VOCAB, generator=g)

    def loss_fn(output, target):
        if VARIANT == "scaled_ce":
            return F.cross_entropy((output * 0.5).flatten(0, 1), target.flatten())
        if VARIANT == "regularizer":
            logits, reg = output
            return F.mse_loss(logits, target) + reg
        return F.mse_loss(output, target)
