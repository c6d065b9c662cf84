"""How `--check` measures a difference, and how large a difference it lets pass.

The measure is relative, per tensor: the norm of the difference over the norm of the reference
(`relative_error`), so a gradient whose values are all near 1e-4 is held to the same 1e-5 as one near 1,
and a tensor 10% off is 10% off whatever its magnitude. A tensor far smaller than the others of its kind
(a gradient under 1e-4 of the largest one's norm) is measured against that floor instead: rounding noise there
is no bug, and nothing such a tensor holds moves training.

The tolerance of each value is derived from the untouched model's own spread (`Precision.tolerance`):

- fp32: the reference's distance from the same model in float64 and from the same fp32 step summed in
  another order, times NOISE_FACTOR, and at least RTOL. A healthy program lies about as far from exact
  arithmetic as the reference does; a wrong one (a gradient scaled by 0.9, a dropped micro-batch) far more.
- fp8 (`--fp8`): the reference is the untouched model as torchao converts it (launch/fp8_reference.py),
  and its spread the distance of the same run from weights one float32 ulp away, times NOISE_FACTOR.
- bf16 / fp16 (`--autocast`): the untouched model run under `torch.autocast` in that dtype, whose distance
  from the fp32 reference is what that precision costs this model, times LOW_NOISE_FACTOR, and at least
  the precision's floor. The program is compared with the fp32 reference: it must be as close to it as
  autocast itself is (gradients included, and the fp32 master gradients where FSDP keeps them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

RTOL = 1e-5
# a value may differ from the fp32 reference by this many times the reference's own rounding noise (two
# fp32 runs in other orders each lie about that far from exact arithmetic)
NOISE_FACTOR = 10.0
# under autocast the program and the autocast twin each round in the low dtype: a healthy program's
# distance from fp32 is the twin's within a small factor, an error of 10% is not
LOW_NOISE_FACTOR = 4.0
# the smallest tolerance per low dtype: bf16 keeps 8 bits of mantissa, fp16 11
LOW_RTOL = {"bf16": 1e-2, "fp16": 2e-3}
# a tensor is measured against at least this fraction of the largest norm of its kind
FLOOR = 1e-4
LOSS_CURVE_RTOL = 1e-4
LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def dense64(t: torch.Tensor) -> torch.Tensor:
    """`t` as the float64 (complex128) dense tensor it stands for: a sparse gradient
    (nn.EmbeddingBag(sparse=True)) is compared as its dense values; integer tensors as they are."""
    t = (t.to_dense() if t.is_sparse else t).detach()
    if t.is_complex():
        return t.to(torch.complex128)
    return t.to(torch.float64) if t.is_floating_point() else t


def norm(t: torch.Tensor) -> float:
    t = dense64(t)
    return float(torch.linalg.vector_norm(t)) if t.numel() and (t.is_floating_point() or t.is_complex()) else 0.0


def relative_error(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """||a - b|| / max(||b||, floor): how far `a` is from the reference `b`, relative to `b`'s magnitude
    (inf where the shapes differ, exact equality for integer tensors)."""
    a, b = dense64(a), dense64(b)
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return 0.0 if torch.equal(a, b) else float("inf")
    diff = float(torch.linalg.vector_norm(a - b))
    if diff == 0.0:
        return 0.0
    if diff != diff:  # nan
        return float("inf")
    return diff / max(float(torch.linalg.vector_norm(b)), floor, 1e-300)


def floor_of(tensors: Iterable[torch.Tensor]) -> float:
    """The floor of a kind of value (all gradients): FLOOR times the largest norm among them."""
    return FLOOR * max((norm(t) for t in tensors), default=0.0)


def relative(a: float, b: float) -> float:
    """The relative distance of two numbers (a loss, a gradient norm) from the reference `b`."""
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-300)


@dataclass(frozen=True)
class Precision:
    """The tolerance rule of one plan's precision: its floor and its noise factor."""

    autocast: str | None = None
    fp8: str | None = None  # --fp8's recipe: the reference is torchao's float8 model, its twin one ulp away

    @classmethod
    def of(cls, plan: Any) -> Precision:
        return cls(plan.autocast, plan.fp8)

    @property
    def low(self) -> bool:
        return self.autocast is not None

    @property
    def floor(self) -> float:
        return LOW_RTOL[self.autocast] if self.autocast else RTOL

    @property
    def curve_floor(self) -> float:
        return LOW_RTOL[self.autocast] if self.autocast else LOSS_CURVE_RTOL

    @property
    def factor(self) -> float:
        return LOW_NOISE_FACTOR if self.autocast else NOISE_FACTOR

    def tolerance(self, noise: float | None, floor: float | None = None) -> float:
        """What a value may differ by: the floor, or the factor times its noise (the spread of the
        untouched model's own runs) where that is larger."""
        base = self.floor if floor is None else floor
        return base if noise is None else max(base, self.factor * noise)

    def describe(self) -> str:
        if self.fp8:
            return (f"fp8 ({self.fp8}, torchao's recipe): each value within {RTOL:g} relative, or {NOISE_FACTOR:g}x the "
                    "distance of torchao's float8 model from itself with its weights one ulp away where that is larger")
        if self.autocast:
            return (f"{self.autocast} autocast: each value within {LOW_NOISE_FACTOR:g}x the distance of the untouched "
                    f"model under torch.autocast from its fp32 run, and at least {self.floor:g} (relative)")
        return (f"fp32: each value within {RTOL:g} relative, or {NOISE_FACTOR:g}x the untouched model's own rounding "
                "noise where that is larger")
