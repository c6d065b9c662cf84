"""Every kind of grad-mode region in one forward: which parameters train must survive the split.

    graphsplit run tests/models/grad_modes.py --pp 2 --steps 2 --check
    graphsplit run tests/models/grad_modes.py:build_export --pp 2 --steps 2 --check   # torch.export's trace

Trained: adapter (enable_grad inside no_grad), body, norm.bias, head.
Never trained: encoder (no_grad), teacher (inference_mode), decorated (@torch.no_grad()
forward), stop (its output is detached), norm.weight (frozen in the constructor).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH = 16


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    @torch.no_grad()
    def forward(self, x):
        return torch.tanh(self.proj(x))


class GradModes(nn.Module):
    def __init__(self, depth: int = 4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
        self.adapter = nn.Linear(WIDTH, WIDTH)
        self.teacher = nn.Linear(WIDTH, WIDTH)
        self.decorated = Decorated()
        self.body = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(depth)])
        self.stop = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.norm.weight.requires_grad_(False)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        with torch.no_grad():
            h = self.encoder(x)
            with torch.enable_grad():
                a = self.adapter(h)
            h = h * 0.5
        with torch.inference_mode():
            t = self.teacher(x)
        h = h + a + t.clone() + self.decorated(x)  # an inference tensor must be cloned before autograd saves it
        for i, layer in enumerate(self.body):
            y = layer(h)
            if i == 1:
                with torch.no_grad():  # in place on values that need gradients: invisible to autograd
                    y.clamp_(-1.0, 1.0)
                    y += 0.25
            h = F.gelu(y) + h
        h = h + self.stop(h).detach()
        return self.head(self.norm(h))


class ExportTraced(GradModes):
    """The same model behind a `*inputs` signature, which torch.fx refuses: torch.export traces it."""

    def forward(self, *inputs):
        return super().forward(*inputs)


def build_model():
    return GradModes()


def build_export():
    return ExportTraced()


def example_inputs():
    return (torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.mse_loss(output, target)
