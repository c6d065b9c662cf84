"""local backend: every stage and every tp shard in one process, with the real semantics.

The batch is cut into the same micro-batches `torch.distributed.pipelining`
makes; each runs through the stages in order, the loss of each is
back-propagated, and gradients are summed then divided by the number of
micro-batches (the schedules' `scale_grads`). Under a zero-bubble schedule each
backward is split as torch's stage splits it: input gradients stage by stage
(outputs detached in place), weight gradients after. Copies of a tied parameter
held by several stages get the sum of their gradients.

With tp > 1 each tp rank is a thread holding its own shards of every stage
(and its own copy of the vocab-parallel loss graph); their communicators are
bound to one `ThreadHub` (threads.py), so every collective runs, with the values
and the count a process group would give. With dp > 1 each tp rank runs the dp
replicas one after the other on the same (step-1) weights, each on its share
of the batch, and their gradients are averaged, as DDP's all-reduce and FSDP's
reduce-scatter leave them; the loss is the replicas' mean, as `run` reports it.
Means over counted tokens are normalized by the sum of the replicas' counts
(runtime/token_count.py), as the ranks' all-reduce gives it.
It is the fast reference for tests and for `transform --check`: no process is
started.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.program import Program
from ..ops.token_scale import TokenScale
from ..ops.tp_comm import TPComm, bind_tp, tp_comms
from ..plan import SPLIT_BACKWARD_SCHEDULES
from ..runtime.microbatch import cut_batch, gather_outputs, join_outputs, stage_output_dims
from ..runtime.token_count import set_factors, token_factors
from ..runtime.training import LossFn, make_loss, named_grads, sync_tied_grads
from .compile_stages import DEFAULT_BACKEND, apply_compile
from .threads import SameDraws, ThreadHub, ThreadLink, run_ranks


class LocalPipeline:
    """One tp rank's stages (all of them), run in order over the micro-batches."""

    def __init__(
        self,
        program: Program,
        stage_modules: Sequence[nn.Module],
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> None:
        self.program = program
        self.stages = list(stage_modules)
        self.loss_fn = loss_fn

    @property
    def split_backward(self) -> bool:
        return self.program.plan.schedule in SPLIT_BACKWARD_SCHEDULES

    def _split_backward(self, inputs: tuple[torch.Tensor, ...], target: Any) -> tuple[Any, torch.Tensor]:
        """One micro-batch as a zero-bubble schedule runs it, with the functions torch's stage calls:
        each stage's inputs detached as if received; backward stage by stage from the last, input
        gradients first (`stage_backward_input`, which detaches the stage's outputs in place), the
        weight gradients after all of them (`stage_backward_weight`; stage 0 runs a full backward
        then, as torch's does)."""
        from torch.distributed.pipelining._backward import (
            stage_backward,
            stage_backward_input,
            stage_backward_weight,
        )

        values: tuple[Any, ...] = inputs
        saved: list[tuple[list[Any], list[torch.Tensor]]] = []
        for index, stage in enumerate(self.stages):
            if index > 0:  # a received activation: a leaf that needs a gradient exactly when the sent one had one
                values = tuple(v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
                               for v in values)
            result = stage(*values)
            outs = [result] if isinstance(result, torch.Tensor) else list(result)
            saved.append((list(values), outs))
            values = tuple(outs)
        out = result
        loss = self.loss_fn(out, target)
        grads: Any = None
        weight_steps: list[Callable[[], Any]] = []
        for index in reversed(range(len(self.stages))):
            stage_inputs, outs = saved[index]
            roots, root_grads = ([loss], None) if index == len(self.stages) - 1 else (outs, grads)
            params = self.stages[index].parameters
            if index == 0:
                weight_steps.append(lambda r=roots, g=root_grads, i=stage_inputs: stage_backward(r, g, i))
                continue
            grads, groups = stage_backward_input(roots, root_grads, stage_inputs, params())
            # an input whose gradient is None (read only where no gradient flows) is sent as zeros
            grads = [torch.zeros_like(x) if g is None and isinstance(x, torch.Tensor) and x.requires_grad else g
                     for g, x in zip(grads, stage_inputs)]
            weight_steps.append(lambda p=params, gr=groups: stage_backward_weight(p(), gr))
        for run_weights in weight_steps:
            run_weights()
        return pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out), loss

    def _own_factors(self, inputs: tuple[torch.Tensor, ...], target: Any) -> None:
        """Run alone (not under `LocalProgram` or a rank, which set each step's global count), this
        pipeline's batch is the whole batch: its count gives the factors of the means over counted
        tokens."""
        modules = [*self.stages, *([self.program.loss_gm] if self.program.loss_gm is not None else [])]
        scales = [m for module in modules for m in module.modules() if isinstance(m, TokenScale)]
        if scales and all(scale.factors is None for scale in scales):  # else a caller set them
            set_factors(modules, token_factors(self.program, [(inputs, target)]))

    def forward_stages(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        values: Any = inputs
        for stage in self.stages:
            values = stage(*values) if isinstance(values, tuple) else stage(values)
        return values

    def step(self, inputs: tuple[torch.Tensor, ...], target: Any,
             keep_output: bool = True) -> tuple[torch.Tensor, Any]:
        """Forward + backward over all micro-batches; returns (mean loss, merged raw output).

        `keep_output=False`: the output is None, and each micro-batch's is dropped once its loss is
        computed, as an eager training step drops its logits (for a language model the largest tensor
        of the step: kept, it and its merged copy would outlive the backward and the optimizer step)."""
        n = self.program.plan.num_microbatches
        self._own_factors(inputs, target)
        losses, outputs = [], []
        for i, (mb_in, mb_target) in enumerate(cut_batch(self.program, inputs, target, n)):
            keep_gathered(self.stages, self.program.plan, last=i == n - 1)
            with contextlib.ExitStack() as quiet:
                if i < n - 1:  # DDP-wrapped stages: accumulate, and all-reduce once, on the last micro-batch
                    for stage in self.stages:
                        if hasattr(stage, "no_sync"):
                            quiet.enter_context(stage.no_sync())
                if self.split_backward:
                    out, loss = self._split_backward(mb_in, mb_target)
                else:
                    out = self.forward_stages(mb_in)
                    loss = self.loss_fn(out, mb_target)
                    if not keep_output:
                        out = None
                    loss.backward()
            losses.append(loss.detach())
            if keep_output:
                outputs.append(out)
            del out
        for stage in self.stages:
            for p in stage.parameters():
                if p.grad is not None:
                    p.grad.div_(n)
        sync_tied_grads(self.program, dict(enumerate(self.stages)))
        merged = join_outputs(outputs, stage_output_dims(self.program)) if keep_output else None
        return torch.stack(losses).mean(), merged

    def evaluate(self, inputs: tuple[torch.Tensor, ...], target: Any) -> torch.Tensor:
        """Forward only over all micro-batches (call under no_grad): the mean loss."""
        n = self.program.plan.num_microbatches
        self._own_factors(inputs, target)
        losses = [self.loss_fn(self.forward_stages(mb_in), mb_target).detach()
                  for mb_in, mb_target in cut_batch(self.program, inputs, target, n)]
        return torch.stack(losses).mean()

    def grads(self) -> dict[str, torch.Tensor]:
        """The gradients under the original model's parameter names (this tp rank's shards)."""
        return named_grads(self.program, dict(enumerate(self.stages)))


def keep_gathered(stages: Sequence[nn.Module], plan: Any, last: bool) -> None:
    """ZeRO-2 over several micro-batches and no pipeline: each FSDP unit's parameters, gathered by the first
    micro-batch's forward, stay gathered until the last micro-batch's backward frees them (a gather a
    step, as ZeRO-2 keeps weights whole; FSDP2 would free and gather them again every micro-batch). The
    gradients are still reduce-scattered after every backward, accumulating in their shards. Under a
    pipeline torch's stage does the same for every plan (its `backward_maybe_with_nosync`)."""
    if plan.zero != 2 or plan.num_microbatches == 1:
        return
    from torch.distributed.fsdp import FSDPModule

    for stage in stages:
        if isinstance(stage, FSDPModule):
            stage.set_reshard_after_backward(last)


@dataclass
class LocalRankStep:
    """One tp rank's result of a step."""

    tp_rank: int
    loss: torch.Tensor  # the mean over the dp replicas
    output: Any  # the last stage's raw output on this replica's share, vocab-sharded tensors gathered
    grads: dict[str, torch.Tensor]  # this rank's shards, by original name, averaged over the replicas
    dp_rank: int = 0


class LocalProgram:
    """A whole program in this process: one `LocalPipeline` per tp rank, a thread each when tp > 1,
    running the dp replicas in turn."""

    def __init__(self, program: Program, source: Mapping[str, torch.Tensor], user_loss: LossFn | None,
                 compile_backend: str = DEFAULT_BACKEND) -> None:
        from ..runtime.materialize import materialize_stages

        plan = program.plan
        if plan.dp > 1 and plan.sync_bn:
            raise GraphsplitError("the local backend runs dp replicas one after the other, and synchronized "
                                  "BatchNorm needs them together; check --sync-bn with run --check")
        if plan.dp > 1 and program.batch.whole_loss:
            what, needs = (("the model's tail", "values") if program.batch.gather else ("the loss", "outputs"))
            raise GraphsplitError(f"the local backend runs dp replicas one after the other, and {what} couples the "
                                  f"samples ({program.batch.whole_loss}): it needs every replica's {needs} at once; "
                                  "check --dp with graphsplit run --check (real processes)")
        if plan.ep > 1:
            raise GraphsplitError("the local backend runs dp replicas one after the other, and expert parallelism "
                                  "exchanges their tokens at once; check --ep with graphsplit run --check (real processes)")
        if plan.cp > 1:
            raise GraphsplitError("the local backend runs dp replicas one after the other, and context parallelism "
                                  "gathers their keys and values at once; check --cp with graphsplit run --check "
                                  "(real processes)")
        self.program = program
        self.hub = ThreadHub(plan.tp) if plan.tp > 1 else None
        self.ranks: list[LocalPipeline] = []
        self.loss_graphs: list[nn.Module | None] = []
        self.comms: list[TPComm] = []  # each rank's, for gathering a sharded output to show it
        for rank in range(plan.tp):
            stages = list(materialize_stages(program, range(len(program.stages)), "cpu", source, rank).values())
            loss_graph = copy.deepcopy(program.loss_gm) if program.loss_gm is not None else None
            comm = TPComm(plan.tp)
            if self.hub is not None:
                link = ThreadLink(self.hub, rank)
                for module in (*stages, *([loss_graph] if loss_graph is not None else []), comm):
                    bind_tp(module, link)
            if plan.compile:
                apply_compile(stages, compile_backend)
            self.ranks.append(LocalPipeline(program, stages, make_loss(program, user_loss, loss_graph)))
            self.loss_graphs.append(loss_graph)
            self.comms.append(comm)

    def step(self, inputs: tuple[torch.Tensor, ...], target: Any,
             within: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> list[LocalRankStep]:
        """One forward + backward on every tp rank and dp replica; results dp-major, tp fastest (the
        mesh's rank order). `within()` is entered around each rank's work, in its own thread (a
        TorchFunctionMode is per thread: `--check`'s dropout off)."""
        dp = self.program.plan.dp
        # the replicas' shares: the batch's first, second, ... dp-th part, as `run` deals them out
        shares = cut_batch(self.program, inputs, target, dp) if dp > 1 else [(inputs, target)]
        # means over counted tokens: each replica counts its share and the counts are summed, as the
        # ranks' all-reduce sums them
        factors = token_factors(self.program, shares)
        for pipe, loss_graph in zip(self.ranks, self.loss_graphs):
            set_factors([*pipe.stages, *([loss_graph] if loss_graph is not None else [])], factors)
        # each rank its own batch, as each process has: a model writing into its input in place must
        # not change another rank's (copied before any rank starts)
        batches = [shares] + [pytree.tree_map_only(torch.Tensor, torch.clone, shares) for _ in range(len(self.ranks) - 1)]

        # tp ranks draw alike, from the generator's state at this step's start (threads: SameDraws)
        same_draws = [SameDraws(torch.get_rng_state()) for _ in self.ranks] if self.hub is not None else []

        def run(rank: int) -> list[LocalRankStep]:
            pipe = self.ranks[rank]
            losses, outputs, grads = [], [], []
            for share_inputs, share_target in batches[rank]:
                for stage in pipe.stages:
                    stage.zero_grad(set_to_none=True)
                with within(), same_draws[rank] if same_draws else contextlib.nullcontext():
                    loss, output = pipe.step(share_inputs, share_target)
                losses.append(loss)
                outputs.append(gather_outputs(self.program, output, self.comms[rank]))
                grads.append({p: p.grad for stage in pipe.stages for p in stage.parameters() if p.grad is not None})
            if dp > 1:  # what the dp all-reduce leaves on every replica
                # a parameter one replica's data did not reach (an expert no token of its share was
                # routed to) has no gradient there: it adds zero to the sum, as in DDP's bucket
                for p in {p: None for g in grads for p in g}:
                    held = [g[p] for g in grads if p in g]  # summed from the first: a sparse gradient
                    p.grad = functools.reduce(operator.add, held) / dp  # (embedding_bag's) takes no 0 + it
            mean = torch.stack(losses).mean()
            named = pipe.grads()
            return [LocalRankStep(rank, mean, out, named, d) for d, out in enumerate(outputs)]

        if self.hub is None:
            return run(0)
        per_rank = run_ranks(self.hub, run)
        torch.set_rng_state(same_draws[0].state)  # the generator where one rank's draws left it
        return [per_rank[t][d] for d in range(dp) for t in range(len(self.ranks))]

    def counts(self, rank: int) -> Counter[tuple[str, str]]:
        """The collectives tp rank `rank` ran so far, per (direction, kind), its loss graph's included."""
        modules = [*self.ranks[rank].stages, *([g] if (g := self.loss_graphs[rank]) is not None else [])]
        return sum((c.counts for m in modules for c in tp_comms(m)), Counter())
