"""Llama 3's shapes as model files for the planner: the Llama example's model at a configuration, fed
token ids of zeros (built on meta: no weights exist). Each shape's file names its configuration and
batch and takes its four functions from `model_file`."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from llama import build_model as _build_llama  # noqa: E402


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def model_file(config: dict[str, Any], batch: int) -> tuple[Callable[..., Any], ...]:
    """build_model, example_inputs, example_target and loss_fn for `batch` sequences of the config's
    max_seq_len tokens."""

    def build_model() -> torch.nn.Module:
        return _build_llama(**config)

    def tokens() -> torch.Tensor:
        return torch.zeros(batch, config["max_seq_len"], dtype=torch.long)

    return build_model, lambda: (tokens(),), tokens, loss_fn
