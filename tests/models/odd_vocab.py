"""examples/gpt.py with a vocabulary of 97, which no tp > 1 divides: the user's model as is,
padded inside graphsplit. `build_model`: the LM head tied to the embedding; `build_untied`: an
LM head of its own, with a bias.

    graphsplit run tests/models/odd_vocab.py --tp 2 --pp 2 --steps 2 --check
"""

import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gpt  # noqa: E402

VOCAB = 97
BATCH = 4
loss_fn = gpt.loss_fn


def build_model():
    return gpt.GPT(gpt.GPTConfig(vocab_size=VOCAB))


def build_untied():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=VOCAB))
    model.lm_head = nn.Linear(model.cfg.n_embd, VOCAB, bias=True)  # its own weight, and a bias
    return model


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, VOCAB, (BATCH, gpt.GPTConfig.block_size), generator=g),)


def example_target():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, gpt.GPTConfig.block_size), generator=g)
