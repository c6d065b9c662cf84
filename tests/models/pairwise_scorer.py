"""Two towers whose every image-text pair is scored by a learned layer (a cross-encoder's head), trained
with the cross-entropy against `labels = arange(n)`: image i's class is text i, so the labels are
positions in the whole batch, and the pairing reads a weight."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IMAGE, TOKENS, VOCAB, DIM = 8, 12, 6, 32, 16


class PairwiseScorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Linear(IMAGE, DIM)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.score = nn.Linear(DIM, 1)

    def forward(self, image, tokens):
        pairs = self.image(image)[:, None, :] * self.embed(tokens).mean(1)[None, :, :]  # [images, texts, DIM]
        logits = self.score(pairs).squeeze(-1)
        labels = torch.arange(logits.shape[0], device=logits.device)
        return F.cross_entropy(logits, labels)


def build_model():
    torch.manual_seed(0)
    return PairwiseScorer()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return {"image": torch.randn(BATCH, IMAGE, generator=g), "tokens": torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g)}


def loss_fn(output):
    return output
