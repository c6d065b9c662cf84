"""Shapes for ops torch has no meta kernel for, so the analysis (on meta) and torch.export (on fake
tensors) can run a model that calls them; the program runs torch's own kernels on real tensors.

They are registered only while graphsplit traces or analyses (`missing_kernels`, entered by
`meta_sizes` and the export trace), on a `torch.library.Library` destroyed after: the largest-size
shapes below are the analysis's rule, not torch's, and must not reach the user's own torch.compile.

- `masked_select` (HF's CTC heads: `labels.masked_select(labels_mask)`): one dim holding every element
  the mask could select (the analysis's rule for sizes that follow the data, ir/devices.py).
- CTC (`F.ctc_loss`, wav2vec2's, HuBERT's, any speech or OCR model's loss): `aten::_ctc_loss` returns each
  sample's loss and the forward variables `log_alpha` (batch, input length, 2 x longest target + 1) its
  backward reads; with the targets concatenated in one dim the longest is taken at its largest (every
  target element); its backward gives the log-probabilities' gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_open: list[Any] = []  # the Library while registered, and how many callers hold it


def _ctc_shapes(log_probs: torch.Tensor, targets: torch.Tensor, *rest: Any) -> tuple[torch.Tensor, torch.Tensor]:
    batched = log_probs.dim() == 3
    padded = batched and targets.dim() == 2  # (batch, longest); else concatenated in one dim
    longest = targets.shape[1] if padded else targets.numel()
    loss = log_probs.new_empty((log_probs.shape[1],) if batched else ())
    alpha = log_probs.new_empty((log_probs.shape[1] if batched else 1, log_probs.shape[0], 2 * longest + 1))
    return loss, alpha


def _ctc_backward_shape(grad: torch.Tensor, log_probs: torch.Tensor, *rest: Any) -> torch.Tensor:
    return torch.empty_like(log_probs)


def _masked_select_largest(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(values.shape, mask.shape)
    return values.new_empty((int(torch.Size(shape).numel()),))


def _has_meta(name: str) -> bool:
    """Whether torch itself has a meta kernel for `name` (some builds do for CTC: torch 2.11's CUDA wheel),
    which register_fake refuses to shadow."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")


def _register(lib: torch.library.Library) -> None:
    for name in ("aten::_ctc_loss", "aten::_ctc_loss.Tensor"):
        if not _has_meta(name):
            torch.library.register_fake(name, _ctc_shapes, lib=lib)
    for name in ("aten::_ctc_loss_backward", "aten::_ctc_loss_backward.Tensor"):
        if not _has_meta(name):
            torch.library.register_fake(name, _ctc_backward_shape, lib=lib)
    # Meta only: torch.export's fake tensors give masked_select a size of their own (an unbacked symbol)
    lib.impl("masked_select", _masked_select_largest, "Meta")


@contextlib.contextmanager
def missing_kernels() -> Iterator[None]:
    """While inside (re-entrant): the kernels above registered."""
    if not _open:
        lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - destroyed on exit, not kept
        _register(lib)
        _open[:] = [lib, 0]
    _open[1] += 1
    try:
        yield
    finally:
        _open[1] -= 1
        if _open[1] == 0:
            _open.pop(0)._destroy()
            _open.clear()
