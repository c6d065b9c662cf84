"""Llama 3 405B's shape (bench/models/llama3_405b.py) at the 131,072-token sequences of its long-context
stage, in batches of 128 sequences (16M tokens, as its 16,384-GPU run with context parallelism: TP8 x CP16
x PP16, 380 TFLOP/s per GPU). Built on meta by the planner: no weights exist."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from llama import build_model as _build_llama  # noqa: E402

CONFIG = dict(n_layers=126, dim=16384, n_heads=128, n_kv_heads=8, hidden=53248, vocab_size=128256, max_seq_len=131072)
BATCH = 128


def build_model():
    return _build_llama(**CONFIG)


def example_inputs():
    return (torch.zeros(BATCH, CONFIG["max_seq_len"], dtype=torch.long),)


def example_target():
    return torch.zeros(BATCH, CONFIG["max_seq_len"], dtype=torch.long)


def loss_fn(logits, target):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
