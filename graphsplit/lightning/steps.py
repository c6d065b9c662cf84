"""A LightningModule's `training_step` (or `validation_step`) as a module graphsplit can trace.

Lightning's loop calls `training_step(batch, batch_idx)`, which computes the loss the module is
trained on (`self(x)` or `self.model(x)`, then a loss) and logs it (`self.log("train_loss", loss)`).
That step, not `forward`, is what graphsplit must cut into stages: it holds the loss. So the step is
traced as the forward of a *copy* of the LightningModule (a shallow one: the same parameters,
buffers and submodules under the same names, so checkpoints keep the module's own keys), whose
class adds two things, on the copy only:

- `forward(batch_0, batch_1, ...)`: the batch's tensors, one input each, put back into the batch's
  structure and given to the step (`batch_idx` 0); it returns the loss (a returned dict's "loss");
- `__call__` inside the step runs the module's own `forward`, so `self(x)` means what it means.

`self.log`/`self.log_dict` in the step are recorded, not run (on the copy: the user's module is
untouched): which names log the loss, with their options, so the strategy logs the pipeline's loss
under them at each step. Logged values other than the loss are not computed (the guide says so).
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from ..errors import GraphsplitError


@dataclass
class LoggedLoss:
    """A `self.log` of the step's loss: its name and options, replayed with the pipeline's loss."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepLog:
    """What one traced run of a step logged: the loss's logs, and the names of other values logged."""

    losses: list[LoggedLoss] = field(default_factory=list)
    others: list[str] = field(default_factory=list)


def _input_names(batch: Any, leaves: list[Any]) -> list[str]:
    """One name per tensor of the batch: a dict batch's keys where they are names, else batch_<i>."""
    if isinstance(batch, Mapping) and len(batch) == len(leaves):
        keys = [str(k) for k in batch]
        if all(k.isidentifier() and not keyword.iskeyword(k) for k in keys) and len(set(keys)) == len(keys):
            return keys
    return [f"batch_{i}" for i in range(len(leaves))]


def batch_tensors(batch: Any, hook: str) -> list[torch.Tensor]:
    """The batch's tensors in pytree order; one line naming what is not a tensor otherwise."""
    leaves = pytree.tree_leaves(batch)
    others = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    if others or not leaves:
        raise GraphsplitError(
            f"GraphsplitStrategy traces {hook}(batch, batch_idx) on the batch's tensors, and this batch holds "
            f"{', '.join(sorted(set(others))) or 'no tensor'}; have the DataLoader yield tensors (a tuple, list or "
            "dict of them)")
    return leaves


def step_module(module: nn.Module, hook: str, batch: Any) -> tuple[nn.Module, StepLog]:
    """A copy of the LightningModule `module` whose forward is its `hook` (training_step,
    validation_step) on a batch shaped like `batch`, and the log it fills each time it runs."""
    leaves = batch_tensors(batch, hook)
    spec = pytree.tree_structure(batch)
    names = _input_names(batch, leaves)
    base = type(module)
    log = StepLog()

    def run_step(self: nn.Module, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        recorded: list[tuple[str, Any, dict[str, Any]]] = []

        def record(name: str, value: Any, *args: Any, **options: Any) -> None:
            recorded.append((name, value, options))

        def record_dict(values: Mapping[str, Any], *args: Any, **options: Any) -> None:
            for name, value in values.items():
                recorded.append((name, value, options))

        self.__dict__.update(log=record, log_dict=record_dict, _graphsplit_in_step=True)
        try:
            out = getattr(base, hook)(self, pytree.tree_unflatten(list(tensors), spec), 0)
        finally:
            for name in ("log", "log_dict", "_graphsplit_in_step"):
                self.__dict__.pop(name, None)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor | fx.Proxy):
            raise GraphsplitError(f"{base.__name__}.{hook} returned {type(out).__name__}, not the loss: return the "
                                  "loss tensor (or a dict with it under 'loss')")
        log.losses[:] = [LoggedLoss(n, o) for n, v, o in recorded if v is loss]
        log.others[:] = [n for n, v, _ in recorded if v is not loss]
        return loss

    def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_graphsplit_in_step"):  # `self(x)` inside the step: the module's own forward
            return base.forward(self, *args, **kwargs)
        return nn.Module.__call__(self, *args, **kwargs)

    params = ", ".join(names)
    scope: dict[str, Any] = {"run_step": run_step}
    exec(f"def forward(self, {params}):\n    return run_step(self, ({params},))\n", scope)  # named inputs
    cls = type(base.__name__, (base,), {"forward": scope["forward"], "__call__": call, "__module__": base.__module__,
                                        "__qualname__": base.__qualname__})
    # a shallow copy by hand: the same parameters, submodules and trainer (copy.copy would go through
    # LightningModule.__getstate__, which drops the trainer)
    traced = cls.__new__(cls)
    traced.__dict__.update(module.__dict__)
    return traced, log
