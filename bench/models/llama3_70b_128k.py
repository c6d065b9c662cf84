"""Llama 3 70B's shape (The Llama 3 Herd of Models, Table 3): 80 layers, model dim 8192, FFN dim 28672,
64 attention heads with 8 key/value heads, vocabulary 128,256; at the 131,072-token sequences of its
long-context stage, in batches of 8 sequences (1M tokens). Built on meta by the planner: no weights exist."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama3 import model_file  # noqa: E402

CONFIG = dict(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, hidden=28672, vocab_size=128256, max_seq_len=131072)
BATCH = 8

build_model, example_inputs, example_target, loss_fn = model_file(CONFIG, BATCH)
