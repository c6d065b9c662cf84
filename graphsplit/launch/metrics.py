"""What `run` reports of each step: one progress line, and with `--metrics FILE` one JSON line.

Only the rank holding the loss reports (the last stage's, dp and tp rank 0): it
alone knows the loss, and every rank knows the global gradient norm and the lr.

    {"step": 3, "loss": 1.01, "lr": 0.005, "grad_norm": 0.8, "clipped": true, "step_seconds": 0.05,
     "samples_per_second": 160.0, "max_memory_bytes": 123456789}

Token-id inputs (an integer tensor of at least two dims: batch x sequence) give
`tokens_per_second` instead of `samples_per_second`. `max_memory_bytes` is the
peak of `torch.cuda.max_memory_allocated` on a GPU, of the process's resident
memory on CPU (`memory` names which). With `--eval-every K`, every K-th step's line
also holds `eval_loss`, the mean loss over eval_data() after that step. Under expert parallelism
`tokens_per_expert` holds, by MoE layer, the tokens each expert received that step over the whole
global batch (the load balance; the progress line shows the worst layer's max / mean). With
`--tensorboard DIR` the same numbers go to TensorBoard too (launch/tensorboard.py).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .tensorboard import ScalarWriter


def work_per_step(args: tuple[Any, ...], kwargs: dict[str, Any], size: int | None = None) -> tuple[str, int]:
    """("tokens", tokens in a global batch) for token-id inputs, else ("samples", the batch size:
    `size`, the program's, where known)."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()]
    for t in tensors:
        if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool and t.dim() >= 2:
            return "tokens", t.numel()
    if size is not None:
        return "samples", size
    return "samples", int(tensors[0].shape[0]) if tensors else 0


def peak_memory(device: torch.device) -> tuple[str, int]:
    """(what was measured, bytes): the peak allocated on a GPU, the peak resident set on CPU."""
    if device.type == "cuda":
        return "cuda_max_allocated", int(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # not on this platform
        return "unknown", 0
    scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB, macOS bytes
    return "cpu_peak_rss", int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


class StepLog:
    """Progress lines through `echo`, JSON lines into `path` (appended to on a resume), scalars into
    the TensorBoard folder `tensorboard`."""

    def __init__(self, path: str | None, unit: str, per_step: int, device: torch.device,
                 append: bool = False, echo: Callable[[str], None] | None = None,
                 tensorboard: str | None = None) -> None:
        self.unit = unit
        self.per_step = per_step
        self.device = device
        self.echo = echo or (lambda line: print(line, flush=True))
        self.file: IO[str] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a" if append else "w")  # noqa: SIM115 - open for the whole run
        self.scalars: ScalarWriter | None = None
        if tensorboard:
            from .tensorboard import ScalarWriter

            self.scalars = ScalarWriter(tensorboard)

    def step(self, step: int, loss: float, lr: float, grad_norm: float, seconds: float,
             clipped: bool = False, skipped: bool = False, eval_loss: float | None = None,
             expert_tokens: dict[str, list[int]] | None = None) -> dict[str, Any]:
        rate = self.per_step / seconds if seconds > 0 else 0.0
        memory_kind, memory = peak_memory(self.device)
        row = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "clipped": clipped,
               "step_seconds": seconds, f"{self.unit}_per_second": rate, "max_memory_bytes": memory,
               "memory": memory_kind}
        if skipped:
            row["skipped"] = True
        if eval_loss is not None:
            row["eval_loss"] = eval_loss
        load = ""
        if expert_tokens:
            row["tokens_per_expert"] = expert_tokens
            worst = max((max(c) * len(c) / sum(c) for c in expert_tokens.values() if sum(c)), default=1.0)
            load = f"  expert load max/mean {worst:.2f}"
        self._write(row)
        if self.scalars is not None:
            self.scalars.add(row)
        note = "  (fp16 overflow: step skipped, loss scale halved)" if skipped else ""
        norm = f"grad norm {grad_norm:.4g}{' (clipped)' if clipped else ''}"
        evaluated = f"  eval loss {eval_loss:.6f}" if eval_loss is not None else ""
        # what training computed first, then after " | " the timings, which differ from run to run
        self.echo(f"step {step:>3}  loss {loss:.6f}  lr {lr:.3e}  {norm}{evaluated}{note}{load}  |  "
                  f"{rate:,.0f} {self.unit}/s  {seconds:.3f} s")
        return row

    def _write(self, row: dict[str, Any]) -> None:
        if self.file is not None:
            # strict JSON: an fp16 overflow's infinite norm is written as null
            clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
            self.file.write(json.dumps(clean, allow_nan=False) + "\n")
            self.file.flush()  # a killed run keeps the lines of the steps it finished

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.scalars is not None:
            self.scalars.close()
