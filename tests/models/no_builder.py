import torch


def example_inputs():
    return (torch.randn(2, 2),)
