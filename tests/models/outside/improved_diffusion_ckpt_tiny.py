"""improved_diffusion_tiny.py with the script's `--use_checkpoint True`: every ResBlock and
AttentionBlock runs through improved_diffusion/nn.py's `checkpoint()`, a torch.autograd.Function of its
own (`CheckpointFunction`) that takes the block's bound method, the number of tensor inputs and the
block's parameters, runs the block under `th.no_grad()` forward, and in backward runs it again under
`th.enable_grad()` and calls `th.autograd.grad` itself for the inputs and the parameters."""

from improved_diffusion_tiny import build_model as _build, example_inputs  # noqa: F401


def build_model():
    return _build(use_checkpoint=True)
