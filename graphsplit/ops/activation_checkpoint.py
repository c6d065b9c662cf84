"""The module a checkpointed region becomes: `self.ckpt_N(*inputs)` in stage code.

Forward runs the region under non-reentrant `torch.utils.checkpoint`, which keeps
only the region's inputs and recomputes the rest during backward (RNG state is
restored, so dropout draws the same masks). `selective=K` keeps the outputs
of its attention calls and of one matmul in K (1: all of them; 2: torchtitan's
op-level policy) instead of recomputing them, and recomputes the rest
(`create_selective_checkpoint_contexts`). Buffers a region
updates in place (BatchNorm's running mean, variance and count) are put back
after the recompute, so they are updated once per forward, as without
checkpointing.

Under a split-backward (zero-bubble) schedule, `backward_twice=True`: the input
gradients and the weight gradients are separate backwards, and torch's weight
backward runs one `autograd.grad` per parameter group; torch's checkpoint
recomputes a region for every backward through it (a Llama block 10 times a
micro-batch). There the region runs under `_RecomputeOnce` instead: the same
non-reentrant scheme (saved tensors replaced by handles, the region run again at
the first unpack, RNG restored), but what the recompute saves is kept for every
later backward through the region until autograd drops the region's graph, so
it runs once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    get_device_states,
    set_device_states,
)

aten = torch.ops.aten
# The ops whose outputs a selective region may keep (analysis/memory.py and the planner count them too):
# attention's, always; the matmuls', one in `every` (SelectiveKeeps)
ATTENTION_KEEPS = {
    aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}
MATMUL_KEEPS = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.addbmm.default,
    aten.linear.default, aten.matmul.default, aten.convolution.default,
}
SELECTIVE_KEEPS = ATTENTION_KEEPS | MATMUL_KEEPS


class SelectiveKeeps:
    """Which op outputs one call of a selective region keeps: every attention's, and one matmul's in
    `every`, the first, then every `every`-th after it (torchtitan's op-level policy at 2: "save every
    other mm"), counted apart in the forward and in the recompute, which run the same ops in order."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.seen = {False: 0, True: 0}

    def keeps(self, op: Any, recompute: bool = False) -> bool:
        if op in ATTENTION_KEEPS:
            return True
        if op not in MATMUL_KEEPS:
            return False
        index = self.seen[recompute]
        self.seen[recompute] = index + 1
        return index % self.every == 0


def _selective_contexts(every: int) -> tuple[Any, Any]:
    keeps = SelectiveKeeps(every)  # one per call of the region: its forward and its recompute

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if keeps.keeps(op, ctx.is_recompute) else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _Handle:
    """What autograd holds for one tensor a region saved: its place in the region's save order."""

    __slots__ = ("frame", "index")

    def __init__(self, frame: _RecomputeOnce, index: int) -> None:
        self.frame = frame
        self.index = index


class _RecomputeOnce:
    """One forward of a checkpointed region whose saved tensors are recomputed once, at the first
    backward through it, and kept for the others (the weight backwards of a split-backward schedule).

    The forward runs under saved-tensor hooks that keep a handle, not the tensor; the region's inputs
    are kept. The first unpack runs the region again on them (detached, with their requires_grad, and
    the forward's RNG state), keeping each tensor it saves in the same order. Everything lives as long
    as autograd holds a handle: until the region's graph is freed after its last backward."""

    def __init__(self, run: Callable[..., Any], args: tuple[Any, ...], context_fn: Callable[[], tuple[Any, Any]] | None
                 ) -> None:
        self.run = run
        self.args = args
        self.context_fn = context_fn
        self.count = 0
        self.values: list[torch.Tensor] | None = None
        self.cpu_rng = torch.get_rng_state()
        self.devices, self.device_rng = get_device_states(*args)

    def forward(self) -> Any:
        forward_ctx, self.recompute_ctx = self.context_fn() if self.context_fn is not None else (
            contextlib.nullcontext(), contextlib.nullcontext())
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), forward_ctx:
            return self.run(*self.args)

    def _pack(self, t: torch.Tensor) -> _Handle:
        handle = _Handle(self, self.count)
        self.count += 1
        return handle

    @staticmethod
    def _unpack(handle: _Handle) -> torch.Tensor:
        frame = handle.frame
        if frame.values is None:
            frame._recompute()
        assert frame.values is not None  # noqa: S101
        return frame.values[handle.index]

    def _recompute(self) -> None:
        values: list[torch.Tensor] = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            values.append(t)
            return t

        args = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                     for a in self.args)
        with torch.random.fork_rng(devices=self.devices), torch.enable_grad():
            torch.set_rng_state(self.cpu_rng)
            if self.devices:
                set_device_states(self.devices, self.device_rng)
            with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), self.recompute_ctx:
                self.run(*args)
        if len(values) != self.count:
            raise RuntimeError(f"internal: a checkpointed region saved {self.count} tensors in its forward and "
                               f"{len(values)} when recomputed")
        self.values = [v.detach() if v.requires_grad else v for v in values]
        self.args = ()  # the recomputed values replace the inputs


class CheckpointRegion(nn.Module):
    """`selective`: 0 recomputes the region whole; K keeps its attention outputs and one matmul output in
    K (`SelectiveKeeps`). `recompute=False`: a block run plainly, wrapped only to be an FSDP unit of its
    own (`block_N`: FSDP with no checkpointing, passes/activation_checkpoint.py)."""

    def __init__(self, inner: nn.Module, selective: int = 0, backward_twice: bool = False,
                 recompute: bool = True) -> None:
        super().__init__()
        self.inner = inner
        self.selective = int(selective)
        self.backward_twice = backward_twice
        self.recompute = recompute
        self.enabled = True

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled() or not self.enabled or not self.recompute:
            return self.inner(*args)
        context = functools.partial(_selective_contexts, self.selective) if self.selective else None
        if self.backward_twice:
            return _RecomputeOnce(self._run_once(), args, context).forward()
        kwargs = {"context_fn": context} if context is not None else {}
        return checkpoint(self._run_once(), *args, use_reentrant=False, **kwargs)

    def _run_once(self) -> Callable[..., Any]:
        """The region for one forward. Its second call is the recompute in backward: the buffers
        the first call updated in place (running statistics) are put back as they were after it."""
        calls = 0
        updated: list[torch.Tensor] = []

        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                before = [(b, b._version) for b in self.inner.buffers()]
                out = self.inner(*args)
                # batch norm's kernel updates running stats without bumping their version
                stats = {id(b) for m in self.inner.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                         and m.training for b in m.buffers()}
                updated.extend(b for b, version in before if b._version != version or id(b) in stats)
                return out
            saved = [(b, b.clone()) for b in updated]
            try:
                return self.inner(*args)
            finally:  # also when checkpoint stops the recompute early
                with torch.no_grad():
                    for b, value in saved:
                        b.copy_(value)

        return run
