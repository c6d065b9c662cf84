"""The Llama example's model fed by data: train_data() a map-style Dataset of 16 token sequences (4 global
batches of 4), eval_data() 8 more. For context parallelism's data path (tests/test_context_parallel.py):
each sample replica's share of a global batch, cut to each cp rank's shard of every sequence."""

import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from llama import build_model, example_inputs, example_target, loss_fn  # noqa: E402, F401

SEQ, VOCAB = 32, 256


class Tokens(Dataset):
    """Sample i: ((tokens,), next tokens), every sample different."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.y = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return (self.x[i],), self.y[i]


def train_data():
    return Tokens(16, 5)


def eval_data():
    return Tokens(8, 6)
