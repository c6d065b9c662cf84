"""Errors injected on purpose into a checked run, to prove that `--check` fails a wrong program.

`GRAPHSPLIT_FAULT` names one or more faults (comma-separated, `name@rank` where a fault hits one rank);
the workers of a `run --check` apply them, and nothing else ever does: a run without `--check` ignores
the variable, so a stray setting cannot change a real training run. Each fault is the kind of error a
real bug makes, at the place it would make it:

- `scale_grad@R`: rank R's first gradient is 0.9 times what it should be, before the dump and the
  optimizer step (a wrong averaging factor);
- `drop_microbatch`: each replica trains on its first micro-batch twice and never on its last (a
  batch dealt out wrongly);
- `shift_shard@R`: rank R's first tp-sharded weight is its neighbour's rows, rolled by one (a wrong
  slice offset);
- `no_dp_reduce`: DDP's gradient all-reduce does nothing: each replica keeps its own share's gradient;
- `scale_output@R`: rank R reports its output 0.9 times too large (a tp rank gathering the wrong output);
- `short_curve`: the last stage reports one step fewer of its loss curve;
- `no_weights@R`: rank R writes no weights after the last step.

The suite's tests/test_check_faults.py runs each under fp32, bf16 and fp16.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..errors import GraphsplitError
from ..ir.program import Program
from ..ir.sharding import Shard

VARIABLE = "GRAPHSPLIT_FAULT"
KNOWN = ("scale_grad", "drop_microbatch", "shift_shard", "no_dp_reduce", "scale_output", "short_curve",
         "no_weights")


@dataclass(frozen=True)
class Faults:
    """The faults this rank applies (empty: a healthy run)."""

    names: frozenset[str] = frozenset()

    @classmethod
    def for_rank(cls, rank: int, checked: bool) -> Faults:
        if not checked:
            return cls()
        found = set()
        for item in filter(None, (s.strip() for s in os.environ.get(VARIABLE, "").split(","))):
            name, _, at = item.partition("@")
            if name not in KNOWN:
                raise GraphsplitError(f"{VARIABLE}: unknown fault {name!r}; known: {', '.join(KNOWN)} (or unset it)")
            if not at or int(at) == rank:
                found.add(name)
        return cls(frozenset(found))

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def after_build(self, program: Program, modules: dict[int, nn.Module], runners: Iterable[nn.Module]) -> None:
        """Faults in the weights and the reduction, applied once the rank's stages exist (`modules`) and
        what the schedule runs (`runners`: DDP's wrappers under plain dp)."""
        from torch.nn.parallel import DistributedDataParallel

        if "shift_shard" in self:
            for index, wrapped in sorted(modules.items()):
                module = wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped
                for local, canonical in program.stages[index].param_sources.items():
                    layout = program.param_sharding(canonical)
                    if isinstance(layout, Shard):
                        p = module.get_parameter(local)
                        with torch.no_grad():
                            p.copy_(torch.roll(p.detach(), 1, dims=layout.dim))
                        return
        if "no_dp_reduce" in self:
            for module in runners:
                if isinstance(module, DistributedDataParallel):
                    module.register_comm_hook(None, _keep_local)

    def batch(self, program: Program, inputs: tuple[Any, ...], target: Any) -> tuple[tuple[Any, ...], Any]:
        """`drop_microbatch`: the replica's last micro-batch replaced by its first."""
        if "drop_microbatch" not in self or program.plan.num_microbatches < 2:
            return inputs, target
        from ..runtime.microbatch import cut_batch, merge_outputs

        pieces = cut_batch(program, inputs, target, program.plan.num_microbatches)
        pieces[-1] = pieces[0]
        dims = [*program.batch.input_dims(program.traced.input_names), *program.batch.target_dims(target)]
        merged = merge_outputs([(tuple(i), t) for i, t in pieces], dims)
        return tuple(merged[0]), merged[1]

    def grads(self, parameters: Iterable[nn.Parameter]) -> None:
        """`scale_grad`: the first gradient this rank holds, times 0.9."""
        if "scale_grad" in self:
            for p in parameters:
                if p.grad is not None:
                    p.grad.mul_(0.9)
                    return

    def output(self, output: Any) -> Any:
        if "scale_output" not in self:
            return output
        import torch.utils._pytree as pytree

        return pytree.tree_map_only(torch.Tensor, lambda t: t * 0.9 if t.is_floating_point() else t, output)

    def curve(self, losses: list[float]) -> list[float]:
        return losses[:-1] if "short_curve" in self else losses


def runners(schedule: Any) -> list[nn.Module]:
    """The modules a rank's schedule runs: a LocalPipeline's stages, or a pipelining schedule's stages'
    submodules (DDP's wrappers under plain dp)."""
    if hasattr(schedule, "stages") and not hasattr(schedule, "_stages"):
        return list(schedule.stages)
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    return [s.submod for s in stages if s is not None]


def _keep_local(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations: none, as strings fail
    """A DDP communication hook that communicates nothing: the bucket keeps this replica's gradient."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
