"""Imports a sibling module: graphsplit makes the model file's folder importable."""

import torch
from tiny import Tiny


def make_tiny():
    return Tiny()


def example_inputs():
    return (torch.randn(4, 4),)
