"""Give one stage real tensors, without ever building the whole model.

`materialize_stage(stage, device, source)` deep-copies the stage's GraphModule
(meta tensors cost nothing to copy), allocates its parameters and buffers on
`device`, and fills them from `source`: a mapping from the original model's
names to tensors, e.g. a `torch.load(..., mmap=True)` file or a real model's
`named_parameters()`. Only this stage's tensors are read.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Iterable, Mapping

import torch
import torch.nn as nn

from ..errors import GraphsplitError
from ..ir.param_grads import params_without_grad
from ..ir.program import Program, StageProgram
from ..ir.sharding import Layout, expert_block, local_shape, shard_tensor
from .fast_init import FastInit


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `model` under every name it has (tied aliases too)."""
    found = dict(model.named_parameters(remove_duplicate=False))
    found.update(model.named_buffers(remove_duplicate=False))
    return found


def _set(module: nn.Module, name: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf in owner._parameters:
        owner._parameters[leaf] = value  # type: ignore[assignment]
    else:
        owner._buffers[leaf] = value


def materialize_stage(
    stage: StageProgram,
    device: torch.device | str,
    source: Mapping[str, torch.Tensor] | FastInit | None,
    seed: int = 0,
    shardings: Mapping[str, Layout] | None = None,
    tp_rank: int = 0,
    tp: int = 1,
    experts: Mapping[str, int] | None = None,
    ep_rank: int = 0,
    ep: int = 1,
) -> nn.Module:
    """This stage's module with real tensors on `device`; sharded parameters hold
    only this tp rank's block (sliced from `source`, never copied whole, or drawn
    block by block on `device` when `source` is a `FastInit`), expert weights (`experts`:
    name -> expert dim) only this expert-parallel rank's experts."""
    shardings = shardings or {}
    experts = experts if ep > 1 and experts else {}
    module = copy.deepcopy(stage.gm)
    _retarget_devices(module, torch.device(device))
    for local, canonical in stage.param_sources.items():
        sharding = shardings.get(canonical)
        if sharding is not None or canonical in experts:
            full = module.get_parameter(local)
            shape = local_shape(tuple(full.shape), sharding, tp) if sharding is not None else tuple(full.shape)
            if canonical in experts:
                dim = experts[canonical]
                shape = (*shape[:dim], shape[dim] // ep, *shape[dim + 1:])
            _set(module, local, nn.Parameter(torch.empty(shape, dtype=full.dtype, device="meta"), full.requires_grad))
    module.to_empty(device=device)
    if isinstance(source, FastInit):
        source.fill_stage(module, stage, shardings, tp_rank, tp, experts, ep_rank, ep)
    elif source is None:
        if shardings or experts:
            raise GraphsplitError("a tensor- or expert-parallel model built on meta needs weights: pass the model "
                                  "built on CPU")
        _init_from_modules(module, stage, seed)
    else:
        with torch.no_grad():
            for local, canonical in (*stage.param_sources.items(), *stage.buffer_sources.items()):
                key = _find(source, canonical, local)
                if key is None:
                    raise GraphsplitError(f"the weights have no tensor {canonical!r} (stage {stage.index} needs it)")
                target = module.get_parameter(local) if local in stage.param_sources else module.get_buffer(local)
                value = source[key]
                if canonical in shardings and local in stage.param_sources:
                    value = shard_tensor(value, shardings[canonical], tp_rank, tp)
                if canonical in experts and local in stage.param_sources:
                    value = expert_block(value, experts[canonical], ep_rank, ep)
                if tuple(value.shape) != tuple(target.shape):
                    raise GraphsplitError(
                        f"weight {canonical!r} has shape {tuple(value.shape)}, the model expects {tuple(target.shape)}"
                    )
                target.copy_(value)
    with torch.no_grad():  # to_empty left them uninitialized: the traced code's own constants
        for local, value in stage.constants.items():
            module.get_buffer(local).copy_(value)
    _retie(module, stage)
    # read here only under no_grad: no gradient ever comes, and DDP would wait for one
    for local in params_without_grad(module):
        module.get_parameter(local).requires_grad_(False)
    return module


def materialize_stages(
    program: Program,
    indices: Iterable[int],
    device: torch.device | str,
    source: Mapping[str, torch.Tensor] | FastInit | None,
    tp_rank: int = 0,
    ep_rank: int = 0,
) -> dict[int, nn.Module]:
    """The stage modules `indices` of `program` for tp rank `tp_rank` (and expert-parallel rank
    `ep_rank`), by stage index."""
    plan = program.plan
    return {s: materialize_stage(program.stages[s], device, source, plan.seed, program.param_shardings, tp_rank, plan.tp,
                                 program.expert_params, ep_rank, plan.ep)
            for s in indices}


def _find(source: Mapping[str, torch.Tensor], canonical: str, local: str) -> str | None:
    """The key holding a tensor: its canonical name, or the name this stage calls it by
    (a tied weight saved under its other name)."""
    for key in (canonical, local):
        if key in source:
            return key
    return None


def _retarget_devices(module: torch.fx.GraphModule, device: torch.device) -> None:
    """Tracing on meta bakes `device='meta'` into factory calls (export's `arange`): point them here."""

    def swap(value: object) -> object:
        return device if isinstance(value, torch.device) and value.type == "meta" else value

    # export keeps no_grad / autocast regions as nested GraphModules: retarget those too
    for sub in module.modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        changed = False
        for node in sub.graph.nodes:
            args = torch.fx.node.map_aggregate(node.args, swap)
            kwargs = torch.fx.node.map_aggregate(node.kwargs, swap)
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs = args, kwargs
                changed = True
        if changed:
            sub.recompile()


def _retie(module: nn.Module, stage: StageProgram) -> None:
    """`to_empty` gives each alias of a tied parameter its own tensor; make them one again."""
    first: dict[str, torch.Tensor] = {}
    for local, canonical in stage.param_sources.items():
        if canonical in first:
            _set(module, local, first[canonical])
        else:
            first[canonical] = module.get_parameter(local)


def _init_from_modules(module: nn.Module, stage: StageProgram, seed: int) -> None:
    """No weights given: run each submodule's own `reset_parameters()`.

    Seeded per module name, so every rank and every plan initializes a module
    the same way. Tensors no `reset_parameters` covers have no known value:
    that is an error, not silent garbage.
    """
    covered: set[str] = set()
    for name, sub in module.named_modules():
        reset = getattr(sub, "reset_parameters", None)
        if not callable(reset):
            continue
        torch.manual_seed(seed + zlib.crc32(name.encode()))
        reset()
        prefix = f"{name}." if name else ""
        covered.update(prefix + k for k, v in sub._parameters.items() if v is not None)
        covered.update(prefix + k for k, v in sub._buffers.items() if v is not None)
    missing = [
        canonical
        for local, canonical in (*stage.param_sources.items(), *stage.buffer_sources.items())
        if local not in covered
    ]
    if missing:
        raise GraphsplitError(
            f"the model was built on meta and {len(missing)} tensor(s) of stage {stage.index} have no "
            f"initializer (first: {missing[0]!r}); pass the model built on CPU or give weights"
        )
