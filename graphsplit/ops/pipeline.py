"""Autograd functions that stage graphs call by name.

`dense_grad(x)`: identity forward; backward makes the gradient contiguous.
A stage's input gradients are sent to the previous stage, and gloo sends only
dense tensors, but autograd may hand back a strided view (the gradient of an
input that went into `torch.cat` is a slice of the cat's gradient).
"""

from __future__ import annotations

import torch


class _DenseGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # an alias, not a view: autograd forbids modifying in place (`h.clamp_()` under no_grad,
        # export's `add_`) a view a custom Function returned; this one it allows, as on `x` itself
        return x.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad.contiguous()


@torch.fx.wrap
def dense_grad(x: torch.Tensor) -> torch.Tensor:
    """Identity whose gradient is always contiguous (see the module docstring)."""
    return _DenseGrad.apply(x)
