"""The Llama example 10 blocks deep: enough copies of a folded block for the planner to price a middle
stage as the same ops a few blocks earlier (tests/test_planner.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from llama import build_model as _build_llama  # noqa: E402
from llama import example_inputs, example_target, loss_fn  # noqa: E402, F401


def build_model():
    return _build_llama(n_layers=10)
