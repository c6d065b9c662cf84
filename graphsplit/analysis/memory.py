"""Activation memory, measured: bytes kept for backward by one forward of a stage.

Method: run the stage once on `meta` tensors (no memory is used) with
`torch.autograd.graph.saved_tensors_hooks`; every tensor an op saves for
backward passes through the pack hook, and we add up the bytes of the distinct
storages they live in (a view and its base count once). Non-reentrant
checkpointing keeps its regions' inputs alive for recomputation instead of
saving tensors through the hooks, so a forward pre-hook on each
`CheckpointRegion` adds the storages of its inputs; a selective region also
keeps the outputs of its matmul-class ops in checkpoint's own cache, which a
dispatch mode counts while that region runs. Parameters are not counted (they
are there anyway; under FSDP with --autocast bf16/fp16 the gathered low-dtype ones,
which a matmul keeps in place of a cast copy per micro-batch); inputs of the stage
itself are.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from ..ops.activation_checkpoint import SELECTIVE_KEEPS, CheckpointRegion, SelectiveKeeps
from ..plan import Plan
from .shapes import meta_copy


def saved_bytes(
    stage: torch.fx.GraphModule,
    inputs: tuple[torch.Tensor, ...],
    tp: int = 1,
    checkpointing: bool = True,
    param_shardings: dict[str, Any] | None = None,
    names: dict[int, str] | None = None,
    param_dtype: torch.dtype | None = None,
) -> int:
    """Bytes kept for backward by one forward of `stage` on inputs shaped like `inputs`;
    `checkpointing=False` runs its checkpoint regions plainly (the figure without the policy).
    `param_dtype`: the dtype the parameters arrive in (`gathered_dtype`: FSDP's low-precision
    gather), so a weight's cast to it is the parameter itself, as it runs."""
    module = meta_copy(stage, param_shardings or {}, tp, names)
    if param_dtype is not None:
        for sub in module.modules():
            for key, p in list(sub._parameters.items()):
                if p is not None and p.is_floating_point():
                    sub._parameters[key] = torch.nn.Parameter(torch.empty(p.shape, dtype=param_dtype, device="meta"),
                                                              requires_grad=p.requires_grad)
    for m in module.modules():
        if isinstance(m, CheckpointRegion):
            m.enabled = checkpointing
    params = {p.untyped_storage()._cdata for p in module.parameters()}
    seen: dict[int, int] = {}

    def note(t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            seen[storage._cdata] = storage.nbytes()

    def pack(t: torch.Tensor) -> torch.Tensor:
        note(t)
        return t

    regions = [m for m in module.modules() if isinstance(m, CheckpointRegion)] if checkpointing else []
    kept_outputs = KeptOutputs(note) if any(m.selective for m in regions) else contextlib.nullcontext()
    hooks = []
    for m in regions:
        hooks.append(m.register_forward_pre_hook(
            lambda _m, args: [note(a) for a in args if isinstance(a, torch.Tensor)] and None))
        if m.selective:
            hooks.append(m.register_forward_pre_hook(lambda _m, _a: kept_outputs.enter(_m.selective)))  # type: ignore[union-attr]
            hooks.append(m.register_forward_hook(lambda _m, _a, _o: kept_outputs.leave()))  # type: ignore[union-attr]
    args = tuple(
        torch.empty(t.shape, dtype=t.dtype, device="meta", requires_grad=t.is_floating_point()) for t in inputs
    )
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), kept_outputs:
            module(*args)
    finally:
        for h in hooks:
            h.remove()
    return sum(seen.values())


def gathered_dtype(plan: Plan) -> torch.dtype | None:
    """The dtype FSDP gathers the parameters in under `plan` (apply_fsdp's MixedPrecisionPolicy under
    --autocast bf16/fp16); None where they arrive as stored."""
    if not plan.fsdp:
        return None
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.autocast or "")


class KeptOutputs(TorchDispatchMode):
    """Inside a selective region, notes the outputs of the ops whose outputs it keeps (`SelectiveKeeps`:
    every attention's, one matmul's in the region's K, counted from each region call's start).
    `on_keep(op, output)`, where given, is told instead of `note`."""

    def __init__(self, note: Any, on_keep: Any = None) -> None:
        super().__init__()
        self.note = note
        self.on_keep = on_keep
        self.stack: list[SelectiveKeeps] = []

    def enter(self, every: int = 1) -> None:
        self.stack.append(SelectiveKeeps(every))

    def leave(self) -> None:
        self.stack.pop()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.stack and func in SELECTIVE_KEEPS and self.stack[-1].keeps(func):
            if self.on_keep is not None:
                self.on_keep(func, out)
            else:
                tree_map_only(torch.Tensor, self.note, out)
        return out
