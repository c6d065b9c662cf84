"""`graphsplit run --tensorboard DIR`: the metrics lines as TensorBoard scalars.

The rank that writes `--metrics` (the one holding the loss) also writes one
event file into DIR, through torch's `SummaryWriter`, each step's numbers under
these tags (x axis: the step):

    train/loss  train/lr  train/grad_norm  train/samples_per_second (or tokens_per_second)
    train/step_seconds  train/max_memory_bytes  eval/loss (every --eval-every steps)

    tensorboard --logdir DIR

tensorboard is an optional extra (`pip install 'graphsplit[tensorboard]'`): it
does not depend on torch, and without it `--tensorboard` is refused before any
process starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import GraphsplitError

# a metrics line's key -> its TensorBoard tag; the throughput key depends on the input
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "samples_per_second": "train/samples_per_second", "tokens_per_second": "train/tokens_per_second",
        "step_seconds": "train/step_seconds", "max_memory_bytes": "train/max_memory_bytes",
        "eval_loss": "eval/loss"}


def require_tensorboard() -> None:
    """One line, before launching, when the tensorboard package is not installed."""
    try:
        import tensorboard  # noqa: F401
    except ImportError as exc:
        raise GraphsplitError("--tensorboard needs the tensorboard package, which is not installed: "
                              "pip install 'graphsplit[tensorboard]' (or pip install tensorboard)") from exc


class ScalarWriter:
    """One SummaryWriter in `folder`; `add(row)` writes a metrics line's numbers as scalars."""

    def __init__(self, folder: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        Path(folder).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=folder)

    def add(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        for key, tag in TAGS.items():
            value = row.get(key)
            # an fp16 overflow's infinite norm: --metrics writes null, here the point is left out
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a killed run keeps the steps it finished, as --metrics does

    def close(self) -> None:
        self.writer.close()
