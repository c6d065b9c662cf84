"""Autograd functions that stage graphs call by name.

`dense_grad(x)`: identity forward; backward makes the gradient contiguous.
A stage's input gradients are sent to the previous stage, and gloo sends only
dense tensors, but autograd may hand back a strided view (the gradient of an
input that went into `torch.cat` is a slice of the cat's gradient).

`sent(x)`: what a stage returns under a zero-bubble schedule: `x` made contiguous,
as a tensor of its own (sharing `x`'s storage, no copy). torch's split backward
(`stage_backward_input`) detaches the stage's outputs in place once their input
gradients are out; were an output the very tensor a later op saved for its weight
gradient (a stage cut after a LayerNorm whose output also feeds a linear), the
weight gradient would then fail on a detached saved tensor.
"""

from __future__ import annotations

import torch

from .eager import eager


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


class _Sent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # an alias that no op of the stage saved: detaching it in place leaves theirs intact
        return x.contiguous().detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


@torch.fx.wrap
@eager  # compiled, AOT autograd would return it as a view of `x` (another output): not detachable
def sent(x: torch.Tensor) -> torch.Tensor:
    """`x` contiguous, as a tensor object of its own (see the module docstring)."""
    return _Sent.apply(x)
