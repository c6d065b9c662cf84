"""A small U-Net: an encoder and a decoder joined by long skip connections.

The first encoder level's output is used by the last decoder level, so under a
pipeline it crosses several stages (graphsplit passes it through).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.norm2 = nn.GroupNorm(4, c_out)

    def forward(self, x):
        x = F.silu(self.norm1(self.conv1(x)))
        return F.silu(self.norm2(self.conv2(x)))


class UNet(nn.Module):
    def __init__(self, c_in: int = 3, c_out: int = 2, widths=(8, 16, 32, 64)):
        super().__init__()
        self.down = nn.ModuleList()
        c = c_in
        for w in widths:
            self.down.append(ConvBlock(c, w))
            c = w
        self.mid = ConvBlock(widths[-1], widths[-1])
        self.up = nn.ModuleList()
        self.upconv = nn.ModuleList()
        for w_skip in reversed(widths[:-1]):
            self.upconv.append(nn.ConvTranspose2d(c, w_skip, 2, stride=2))
            self.up.append(ConvBlock(2 * w_skip, w_skip))
            c = w_skip
        self.head = nn.Conv2d(c, c_out, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x)
            if i < len(self.down) - 1:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for upconv, block in zip(self.upconv, self.up):
            x = upconv(x)
            x = block(torch.cat([x, skips.pop()], dim=1))
        return self.head(x)


def build_model():
    return UNet()


def example_inputs():
    return (torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def example_target():
    return torch.randn(4, 2, 32, 32, generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.mse_loss(output, target)
