"""Runs the passes in order: lints, times, and names the pass that failed.

A pass is a function `(gm, ctx) -> gm`. The passes live in this package:
`grad_mode.py` (first: ops the model ran under no_grad / inference_mode get detached
inputs, so the program trains exactly what the model trains),
`sync_batch_norm.py` (with --sync-bn, BatchNorm statistics over the dp replicas),
`tensor_parallel/` (shard linears/embeddings, insert tp collectives),
`vocab_parallel_loss.py` (keep vocab-sharded logits into a cross-entropy),
`autocast.py` (matmuls in bf16, norms/softmax/loss in fp32), then
`pipeline_split.py` (assign nodes to pipeline stages), then
`activation_checkpoint.py` (wrap regions of each stage in activation checkpointing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..errors import GraphsplitError
from ..plan import Plan

Pass = Callable[[fx.GraphModule, "PassContext"], fx.GraphModule]


@dataclass
class PassContext:
    """What passes may read (the plan, example inputs) and the timings they leave."""

    plan: Plan
    inputs: tuple[torch.Tensor, ...]
    # Node names where stages start, from a saved plan.json: reproduces a split exactly.
    fixed_cuts: tuple[str, ...] | None = None
    disabled: frozenset[str] = frozenset()
    timings: dict[str, float] = field(default_factory=dict)
    # left by tensor_parallel: canonical parameter name -> Shard, and what stayed whole and why
    param_shardings: dict[str, Any] = field(default_factory=dict)
    replicated: list[dict[str, str]] = field(default_factory=list)
    # the loss, for passes that rewrite it with the model (vocab-parallel cross-entropy)
    loss_fn: Any = None
    target: Any = None
    out_spec: Any = None
    loss_gm: Any = None
    sharded_outputs: dict[int, Any] = field(default_factory=dict)
    checkpoint_regions: list[list[str]] = field(default_factory=list)


def default_passes() -> list[tuple[str, Pass]]:
    from .activation_checkpoint import checkpoint_pass
    from .autocast import autocast_pass
    from .grad_mode import grad_mode_pass
    from .pipeline_split import pipeline_split_pass
    from .sync_batch_norm import sync_batch_norm_pass
    from .tensor_parallel import tensor_parallel_pass
    from .vocab_parallel_loss import vocab_parallel_loss_pass

    return [
        ("grad_mode", grad_mode_pass),
        ("sync_batch_norm", sync_batch_norm_pass),
        ("tensor_parallel", tensor_parallel_pass),
        ("vocab_parallel_loss", vocab_parallel_loss_pass),
        ("autocast", autocast_pass),
        ("pipeline_split", pipeline_split_pass),
        ("checkpoint", checkpoint_pass),
    ]


def run_passes(gm: fx.GraphModule, ctx: PassContext, passes: list[tuple[str, Pass]] | None = None) -> fx.GraphModule:
    done: list[str] = []
    for name, fn in passes if passes is not None else default_passes():
        if name in ctx.disabled:
            continue
        start = time.perf_counter()
        try:
            out = fn(gm, ctx)
        except GraphsplitError:
            raise
        except Exception as exc:
            after = ", ".join(done) or "no other pass"
            raise GraphsplitError(f"pass {name} failed (after {after}): {type(exc).__name__}: {exc}") from exc
        if not isinstance(out, fx.GraphModule):
            raise GraphsplitError(f"pass {name} returned {type(out).__name__}, not a GraphModule")
        out.graph.lint()
        ctx.timings[name] = time.perf_counter() - start
        done.append(name)
        gm = out
    return gm
