"""Moving a batch (any nest of tensors) onto a rank's device.

On CUDA each CPU tensor is first copied into pinned (page-locked) host memory,
then copied to the GPU with `non_blocking=True`: the host-to-device copy runs
on the copy engine, asynchronously with the Python that goes on to launch the
step's kernels on the same stream, so it needs no synchronization. torch's
pinned-memory allocator keeps the pinned buffer alive until the copy has run.
On CPU the batch is returned as it is: pinning needs a GPU, and `.to("cpu")`
of a CPU tensor is the tensor itself.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree


def to_device(value: Any, device: torch.device) -> Any:
    """`value` with every tensor on `device`: pinned and copied asynchronously when it is a GPU."""
    if device.type != "cuda":
        return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), value)
    return pytree.tree_map_only(torch.Tensor, lambda t: _to_cuda(t, device), value)


def _to_cuda(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
