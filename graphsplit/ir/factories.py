"""Factories: calls that make a tensor from sizes or Python values (torch.arange(n), torch.zeros(3),
torch.tensor([..])), on the default device unless told `device=`. Found from ATen's own schemas (a `device`
argument and no tensor argument), so the list is torch's, not ours."""

from __future__ import annotations

import torch
import torch.fx as fx

from .op_kinds import op_name

aten = torch.ops.aten


def _factory_names() -> frozenset[str]:
    names = {"tensor"}  # a Python-level factory with no ATen op of its own
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if name.startswith("_") or not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            arguments = getattr(packet, overload)._schema.arguments
            if (any(a.name == "device" for a in arguments) and not overload.endswith("out")
                    and not any("Tensor" in str(a.type) for a in arguments)):
                names.add(name)
                break
    return frozenset(names - {"normal"})  # torch.normal(mean, std) also takes tensors: not always a factory


_FACTORIES = _factory_names()


def makes_tensor(node: fx.Node) -> bool:
    """`node` is a torch factory call (`torch.arange(T)`, any overload of ATen's `arange`), which
    puts its tensor on the device its `device=` names, else on the default device."""
    if node.op != "call_function":
        return False
    name = op_name(node)
    if name not in _FACTORIES:
        return False
    return isinstance(node.target, torch._ops.OpOverload | torch._ops.OpOverloadPacket) or \
        getattr(torch, name, None) is node.target
