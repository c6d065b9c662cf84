"""The GPT example two blocks deep: the fewest blocks a pipeline of 2 splits into, for tests whose
cost grows with the graph (torch.compile of every stage, tests/test_compile_stages.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpt import build_model as _build_gpt  # noqa: E402
from gpt import example_inputs, example_target, loss_fn  # noqa: E402, F401


def build_model():
    return _build_gpt(n_layer=2)

