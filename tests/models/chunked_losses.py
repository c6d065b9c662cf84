"""A small language model and losses computed in chunks of its flattened tokens, each a way people write
them (litgpt's own, unchanged, is in the outside zoo: tests/models/outside/litgpt_tiny.py). The prompt's
tokens are masked with -100, a different number in each sample.

    loss_fn             each chunk's cross-entropy summed, added up from 0.0, divided by the counted
                        tokens (at least one): the whole batch's, however its rows are cut
    chunk_means_loss    the mean of the chunks' means: weighs tokens by how the rows were cut
    first_chunk_loss    the first chunk's mean alone: only some rows, picked by how they were cut
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, BATCH, SEQ, CHUNK = 32, 16, 4, 10, 12


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + torch.tanh(self.mix(h)).cumsum(1) / torch.arange(1, h.shape[1] + 1, device=h.device)[:, None]
        return self.head(h)


def build_model():
    torch.manual_seed(0)
    return TinyLM()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)),)


def example_target():
    target = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    for i, prompt in enumerate((1, 6, 3, 0)):
        target[i, :prompt] = -100
    return target


def _chunks(logits, target):
    return zip(logits.reshape(-1, VOCAB).split(CHUNK), target.reshape(-1).split(CHUNK))


def loss_fn(logits, target):
    total = 0.0
    for chunk, labels in _chunks(logits, target):
        total += F.cross_entropy(chunk, labels, ignore_index=-100, reduction="sum")
    return total / (target != -100).sum().clamp(min=1)


def chunk_means_loss(logits, target):
    return torch.stack([F.cross_entropy(c, t, ignore_index=-100) for c, t in _chunks(logits, target)]).mean()


def first_chunk_loss(logits, target):
    chunk, labels = next(iter(_chunks(logits, target)))
    return F.cross_entropy(chunk, labels, ignore_index=-100)
