"""local backend: every stage in one process, with the pipeline's semantics.

The batch is cut into the same micro-batches `torch.distributed.pipelining`
makes; each runs through the stages in order, the loss of each is
back-propagated, and gradients are summed then divided by the number of
micro-batches (the schedules' `scale_grads`). Copies of a tied parameter
held by several stages get the sum of their gradients. It is the fast
reference for tests and for `transform --check`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from ..errors import GraphsplitError
from ..ir.program import Program
from ..runtime.microbatch import merge_outputs, split_microbatches
from ..runtime.training import sync_tied_grads


class LocalPipeline:
    def __init__(
        self,
        program: Program,
        stage_modules: Sequence[nn.Module],
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> None:
        self.program = program
        self.stages = list(stage_modules)
        self.loss_fn = loss_fn

    def forward_stages(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        values: Any = inputs
        for stage in self.stages:
            values = stage(*values) if isinstance(values, tuple) else stage(values)
        return values

    def step(self, inputs: tuple[torch.Tensor, ...], target: Any) -> tuple[torch.Tensor, Any]:
        """Forward + backward over all micro-batches; returns (mean loss, merged raw output)."""
        n = self.program.plan.num_microbatches
        chunks = split_microbatches(inputs, n)
        targets = split_microbatches(target, n)
        losses, outputs = [], []
        for i, (mb_in, mb_target) in enumerate(zip(chunks, targets)):
            with contextlib.ExitStack() as quiet:
                if i < n - 1:  # DDP-wrapped stages: accumulate, and all-reduce once, on the last micro-batch
                    for stage in self.stages:
                        if hasattr(stage, "no_sync"):
                            quiet.enter_context(stage.no_sync())
                out = self.forward_stages(mb_in)
                loss = self.loss_fn(out, mb_target)
                loss.backward()
            losses.append(loss.detach())
            outputs.append(out)
        for stage in self.stages:
            for p in stage.parameters():
                if p.grad is not None:
                    p.grad.div_(n)
        sync_tied_grads(self.program, dict(enumerate(self.stages)))
        return torch.stack(losses).mean(), merge_outputs(outputs)


def check_locally(loaded: Any, plan: Any, fixed_cuts: tuple[str, ...] | None = None) -> tuple[Program, Any]:
    """Compile `loaded` (a LoadedModel) under `plan`, run step 1 of every stage in this
    process, and compare loss, output and gradients with the untouched model."""
    from ..compile import compile_loaded
    from ..launch.parity import compare, missing_grads, reference_step
    from ..runtime.materialize import materialize_stage, model_tensors
    from ..runtime.training import default_loss, make_loss

    if plan.tp > 1:
        raise GraphsplitError("the local backend runs pipeline stages only; check tensor parallelism with run --check")
    model = loaded.build("cpu", seed=plan.seed)
    program = compile_loaded(loaded, plan, fixed_cuts).program
    source = model_tensors(model)
    stages = [materialize_stage(s, "cpu", source) for s in program.stages]
    pipe = LocalPipeline(program, stages, make_loss(program, loaded.loss_fn))
    target = loaded.target
    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    if target is None:
        target = torch.zeros(inputs[0].shape[0])
    loss, out = pipe.step(inputs, target)
    grads: dict[str, torch.Tensor] = {}
    for st, module in zip(program.stages, stages):
        for local, canonical in st.param_sources.items():
            g = module.get_parameter(local).grad
            if g is not None:
                grads[f"{canonical}"] = g
    ref = reference_step(model, loaded.args, loaded.kwargs, target, loaded.loss_fn or default_loss, plan.num_microbatches)
    cmp = compare(loss, program.unflatten_output(out), grads, ref)
    missing = missing_grads(ref, set(grads))
    if missing:
        cmp.failures.append(f"no stage produced a gradient for {', '.join(missing[:5])}")
    return program, cmp
