"""Export a model built on `meta` as if it sat on the CPU.

Models branch on where their tensors live: HF's grouped experts feed `torch.histc`
floats on "cpu"/"mps" and int32 elsewhere, since CPU has no integer histogram.
Exported on `meta`, such a model takes the not-CPU branch, and the stage code then
runs `histc` on an int tensor on the CPU and fails ("histogram_cpu" not implemented
for 'Int'), although the untouched model runs. So a meta model is exported with fake
tensors that claim the CPU (no memory is allocated): every branch is the one the
model takes when built normally. CPU branches are the portable ones: they also run
on CUDA, where the program's factory calls are retargeted to the rank's device.

Afterwards the graph is made device-neutral again, exactly as a meta trace leaves it:
`device=cpu` arguments read `meta` (materialize.py points them at the rank's device)
and the module holds the model's own meta parameters and buffers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

TRACE_DEVICE = torch.device("cpu")
_META = torch.device("meta")


def on_meta(model: nn.Module) -> bool:
    """The model was built on meta: its parameters are (its buffers may be real: a constructor that
    cannot run on meta is built with real buffers, loader.py)."""
    params = list(model.parameters())
    if params:
        return all(p.device.type == "meta" for p in params)
    buffers = list(model.buffers())
    return bool(buffers) and all(b.device.type == "meta" for b in buffers)


@contextlib.contextmanager
def as_if_on_cpu(model: nn.Module) -> Iterator[FakeTensorMode]:
    """While inside, `model`'s meta parameters and buffers are fake CPU tensors (restored
    on exit); inputs must be made fake with the yielded mode (`fake_inputs`)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(t: torch.Tensor) -> torch.Tensor:
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=TRACE_DEVICE)

    # export's verifier wants parameters to be nn.Parameter; a tied weight is given once, under
    # its first name, and `tie_weights` gives its other names the same fake tensor
    state: dict[str, torch.Tensor] = {
        name: nn.Parameter(fake(p), requires_grad=p.requires_grad) for name, p in model.named_parameters()
    }
    state.update({name: fake(b) for name, b in model.named_buffers()})
    # torch restores a module reached under two names (one attention block shared by two layers)
    # by one name only: the other keeps the fake tensor. Put back what every module held.
    held = [(sub, dict(sub._parameters), dict(sub._buffers)) for sub in model.modules()]
    try:
        with _reparametrize_module(model, state, tie_weights=True):
            yield mode
    finally:
        for sub, parameters, buffers in held:
            sub._parameters.update(parameters)
            sub._buffers.update(buffers)


def fake_inputs(mode: FakeTensorMode, value: torch.Tensor) -> torch.Tensor:
    with mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=TRACE_DEVICE)


def back_to_meta(gm: fx.GraphModule, model: nn.Module) -> None:
    """The exported module as a meta trace leaves it: the model's meta tensors, `meta` devices."""
    own = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    for sub_name, sub in list(gm.named_modules()):
        for attr, value in list({**sub._parameters, **sub._buffers, **vars(sub)}.items()):
            if not isinstance(value, FakeTensor):
                continue
            name = f"{sub_name}.{attr}" if sub_name else attr
            meta = own.get(name)
            if meta is None:  # a lifted constant: its shape survives, as on a meta trace
                meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_META)
            if attr in sub._parameters:
                sub._parameters[attr] = meta if isinstance(meta, nn.Parameter) else nn.Parameter(meta)
            elif attr in sub._buffers:
                sub._buffers[attr] = meta
            else:
                setattr(sub, attr, meta)

    def swap(value: object) -> object:
        if isinstance(value, torch.device) and value == TRACE_DEVICE:
            return _META
        return value

    for sub in gm.modules():
        if isinstance(sub, fx.GraphModule):
            for node in sub.graph.nodes:
                node.args = fx.node.map_aggregate(node.args, swap)
                node.kwargs = fx.node.map_aggregate(node.kwargs, swap)
            sub.recompile()
