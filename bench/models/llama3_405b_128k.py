"""Llama 3 405B's shape (bench/models/llama3_405b.py) at the 131,072-token sequences of its long-context
stage, in batches of 128 sequences (16M tokens, as its 16,384-GPU run with context parallelism: TP8 x CP16
x PP16, 380 TFLOP/s per GPU). Built on meta by the planner: no weights exist."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama3 import model_file  # noqa: E402
from llama3_405b import CONFIG as _AT_8K  # noqa: E402

CONFIG = {**_AT_8K, "max_seq_len": 131072}
BATCH = 128

build_model, example_inputs, example_target, loss_fn = model_file(CONFIG, BATCH)
