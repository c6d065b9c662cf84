"""Blocks checkpointed by a hand-written `torch.autograd.Function` given the block's own method, as
Megatron-LM's `tensor_parallel.checkpoint`, DeepSpeed's `checkpointing.checkpoint` and the
CheckpointFunction of openai's guided/improved-diffusion and CompVis' latent diffusion write it:
forward runs `run_function` under `torch.no_grad()`, backward runs it again under
`torch.enable_grad()` and differentiates that. Its gradient is the callable's own.

    build_model          traced by torch.fx
    build_keyword_model  the same behind `forward(x, **kwargs)`: traced by torch.export
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, length, *args):
        ctx.run_function = run_function
        ctx.input_tensors = list(args[:length])
        ctx.input_params = list(args[length:])
        with torch.no_grad():
            output_tensors = ctx.run_function(*ctx.input_tensors)
        return output_tensors

    @staticmethod
    def backward(ctx, *output_grads):
        ctx.input_tensors = [x.detach().requires_grad_(True) for x in ctx.input_tensors]
        with torch.enable_grad():
            shallow_copies = [x.view_as(x) for x in ctx.input_tensors]
            output_tensors = ctx.run_function(*shallow_copies)
        input_grads = torch.autograd.grad(output_tensors, ctx.input_tensors + ctx.input_params, output_grads,
                                          allow_unused=True)
        del ctx.input_tensors, ctx.input_params, output_tensors
        return (None, None) + input_grads


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return CheckpointFunction.apply(self._forward, 2, x, scale, *self.parameters())

    def _forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x)))) * scale


class Net(nn.Module):
    def __init__(self, dim: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.scale = nn.Parameter(torch.ones(dim))
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, self.scale)
        return self.head(h)


class KeywordNet(Net):
    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:  # torch.fx cannot trace **kwargs calls
        return super().forward(x)


def build_model():
    return Net()


def build_keyword_model():
    return KeywordNet()


def example_inputs():
    return (torch.randn(8, 6, 8),)


def example_target():
    return torch.randn(8, 6, 4)


def loss_fn(out, target):
    return F.mse_loss(out, target)
