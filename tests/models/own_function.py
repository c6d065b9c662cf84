"""Models with their own torch.autograd.Function, whose backward is not the forward's derivative:
a gradient-reversal layer (DANN's: forward `x.view_as(x)`, backward `-alpha * g`) and a
straight-through sign with two outputs and a saved tensor. Traced through, their forwards are an
identity and a sign, and autograd would differentiate those instead.

    build_model          both, traced by torch.fx (each Function one node with its own backward)
    build_keyword_model  the same behind `forward(x, **kwargs)`: torch.fx refuses it, torch.export
                         would trace through the Functions, so graphsplit refuses it in one line
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.alpha * grad, None


class SignStraightThrough(torch.autograd.Function):
    """(sign(x), x * scale); the sign's gradient passes straight through where |x| <= 1."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.sign(x), x * scale

    @staticmethod
    def backward(ctx, grad_sign, grad_scaled):
        (x,) = ctx.saved_tensors
        return grad_sign * (x.abs() <= 1).to(grad_sign.dtype) + grad_scaled * ctx.scale, None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        h = GradReverse.apply(h, 0.5)
        s, t = SignStraightThrough.apply(self.l2(h), 0.25)
        return self.head(torch.relu(self.l3(s + t)))


class KeywordNet(Net):
    def forward(self, x, **kwargs):
        return super().forward(x)


def build_model():
    torch.manual_seed(0)
    return Net()


def build_keyword_model():
    torch.manual_seed(0)
    return KeywordNet()


def example_inputs():
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),)


def example_target():
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(2))


def loss_fn(output, target):
    return F.mse_loss(output, target)
