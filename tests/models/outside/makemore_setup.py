"""Shared by makemore_*_tiny.py (ours): makemore's own data path at a small batch. `create_datasets(names.txt)`
(makemore.py, unchanged; it prints its dataset summary, silenced here) then a batch of its CharDataset items
stacked as its DataLoader does: x = [0, word..., 0...], y = [word..., 0, -1...] (-1 masks the loss)."""

import contextlib
import io
from pathlib import Path

import torch
from makemore.makemore import ModelConfig, create_datasets

NAMES = str(Path(__file__).parent / "makemore" / "names.txt")
BATCH = 8


def datasets():
    torch.manual_seed(3407)  # makemore's --seed default; create_datasets draws torch.randperm
    with contextlib.redirect_stdout(io.StringIO()):
        return create_datasets(NAMES)


def config(**sizes):
    train_dataset, _ = datasets()
    return ModelConfig(vocab_size=train_dataset.get_vocab_size(), block_size=train_dataset.get_output_length(), **sizes)


def batch():
    train_dataset, _ = datasets()
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, len(train_dataset), (BATCH,), generator=g).tolist()
    xs, ys = zip(*(train_dataset[i] for i in rows))
    return torch.stack(xs), torch.stack(ys)
