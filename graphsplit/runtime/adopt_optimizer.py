"""A script's optimizer, built over the untouched model, made to step this rank's parameters.

Training scripts build their optimizer from the model before wrapping it (nanoGPT's
`configure_optimizers` puts matrices in a weight-decay group and the rest in another; HF's
Trainer does the same by name), and keep using that object: the LR schedule writes its
`param_groups`, a scheduler holds it, the loop steps it. So the optimizer is kept and changed in
place: each group keeps its hyper-parameters and gets, for each parameter of the untouched
model it held, this rank's copies of it (a tp shard, an FSDP shard, both copies of a tied
weight where this rank holds two stages), and nothing for parameters on other ranks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch
import torch.nn as nn

from ..errors import GraphsplitError


def adopt_optimizer(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    held: Mapping[str, list[nn.Parameter]],
) -> None:
    """Point `optimizer`'s groups at this rank's parameters. `model`: the untouched model the groups
    were built over; `held`: this rank's copies of each parameter, by the model's (first) name."""
    if any(optimizer.state.values()):
        raise GraphsplitError(
            f"the {type(optimizer).__name__} given to parallelize() has already stepped (it holds state for the "
            "untouched model's tensors); give a fresh one and restore its state with load_checkpoint()")
    names: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    for index, group in enumerate(optimizer.param_groups):
        params: dict[int, nn.Parameter] = {}
        for p in group["params"]:
            if id(p) not in names:
                raise GraphsplitError(
                    f"parameter group {index} of the {type(optimizer).__name__} given to parallelize() holds a "
                    f"tensor of shape {tuple(p.shape)} that is not a parameter of the model; build the optimizer "
                    "over the model's parameters")
            for name in names[id(p)]:
                for copy in held.get(name, ()):
                    params.setdefault(id(copy), copy)
        group["params"] = list(params.values())
        group.pop("param_names", None)  # torch's named groups: the names no longer line up one to one
    optimizer.state = defaultdict(dict)


def held_parameters(stage_sources: Mapping[int, Mapping[str, str]], modules: Mapping[int, nn.Module]) -> dict[str, list[nn.Parameter]]:
    """This rank's parameters by the untouched model's name: `stage_sources[i]` maps stage i's local
    parameter names to the model's; `modules[i]` is stage i's module as it now trains (after FSDP
    made its parameters DTensors)."""
    held: dict[str, list[nn.Parameter]] = defaultdict(list)
    for index, module in modules.items():
        for local, canonical in stage_sources[index].items():
            p = module.get_parameter(local)
            if all(p is not q for q in held[canonical]):
                held[canonical].append(p)
    return dict(held)
