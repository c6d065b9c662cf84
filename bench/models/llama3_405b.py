"""Llama 3 405B's shape (The Llama 3 Herd of Models, Table 3): 126 layers, model dim 16384, FFN dim 53248,
128 attention heads with 8 key/value heads, vocabulary 128,256, trained on sequences of 8,192 tokens in
batches of 2,048 sequences (16M tokens; Table 4). Built on meta by the planner: no weights exist."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama3 import model_file  # noqa: E402

CONFIG = dict(n_layers=126, dim=16384, n_heads=128, n_kv_heads=8, hidden=53248, vocab_size=128256, max_seq_len=8192)
BATCH = 2048

build_model, example_inputs, example_target, loss_fn = model_file(CONFIG, BATCH)
