"""`--check` under `--fp8`: the untouched model as torchao converts it, and that model's own spread.

The program's float8 linears are torchao's (ops/float8.py), so the reference is the untouched model
with the same `nn.Linear` modules converted by `torchao.float8.convert_to_float8_training` (the same
recipe, GEMMs emulated in float32 on the float8 values, as the program's off a GPU). A float64 twin
means nothing here (float8 rounds what float64 would keep); the reference's own spread is measured
instead by a twin whose weights are one float32 ulp away (`nudged`): float8's rounding boundaries turn
such a difference, as they turn the float32 rounding of tp's partial sums, into whole float8 steps on a
few values, and a healthy program lies within a small factor of that spread.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn as nn

NUDGE = 2.0 ** -24  # one float32 ulp, relative


def float8_reference(model: nn.Module, modules: tuple[str, ...], recipe: str) -> nn.Module:
    """`model` with the `modules` (names of its nn.Linear modules) converted by torchao, in place."""
    from ..ops.float8 import import_torchao

    import_torchao()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    chosen = set(modules)
    return convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in chosen)


def nudged(model: nn.Module) -> nn.Module:
    """A copy of `model` whose every floating-point parameter is one ulp away, drawn from its own generator
    (the global one is left where it was)."""
    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in twin.parameters():
            if p.is_floating_point():
                p.mul_(1 + NUDGE * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))
    return twin
