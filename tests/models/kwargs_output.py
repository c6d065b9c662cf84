"""A model whose forward takes `**kwargs` it is never given, returns an HF `ModelOutput`, branches on
its own buffer (as minimind's `if self.freqs_cos[0, 0] == 0:`, which stops torch.export) and on the
size of a hidden state inside each block (`bsz, seq_len, _ = x.shape; if seq_len > 1:`), as minimind's
attention does. torch.fx traces it on its named parameters, the buffer branch decided by the
constructor's values and the size read from the ops run on meta tensors."""

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.utils import ModelOutput

VOCAB, WIDTH, BATCH, SEQ = 32, 16, 4, 6


@dataclass
class Output(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, **kwargs):
        bsz, seq_len, _ = x.shape
        h = self.mix(self.norm(x))
        if seq_len > 1:  # the previous token's features too, where there is one
            h = h + F.pad(h[:, :-1], (0, 0, 1, 0))
        return x + h


class KwargsOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("scale", torch.full((1, 1), 0.5), persistent=False)

    def forward(self, input_ids, labels=None, **kwargs):
        if self.scale[0, 0] == 0:  # lost to a meta-device init: put back (never, built as graphsplit builds it)
            self.scale = torch.full((1, 1), 0.5, device=input_ids.device)
        x = self.embed(input_ids) * self.scale
        for block in self.blocks:
            x = block(x, **kwargs)
        logits = self.head(x)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        return Output(loss=loss, logits=logits)


def build_model():
    torch.manual_seed(0)
    return KwargsOutput()


def example_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids.clone()}


def loss_fn(output):
    return output.loss
