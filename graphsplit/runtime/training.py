"""The objective a pipeline's last stage computes, the optimizer and its settings, and the gradients of
tied copies."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.meta import info
from ..ir.program import Program
from .microbatch import stage_output_dims
from .whole_batch import gather_replicas

LossFn = Callable[[Any, Any], torch.Tensor]


def own_loss(output: Any) -> tuple[str, torch.Tensor] | None:
    """The loss a model computed itself, and where it sits in its output: the output when it is a
    scalar, `output.loss` (HF's ModelOutput, a dict) when that is a scalar, else the scalar among a
    tuple's items (nanoGPT's `(logits, loss)`, HF's `return_dict=False` `(loss, logits)`; the
    first when there are several). None when the output holds no floating-point scalar."""

    def scalar(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()

    if scalar(output):
        return "output", output
    if isinstance(output, Mapping):  # dict, HF's ModelOutput
        loss = output.get("loss")
        return ("output.loss", loss) if scalar(loss) else None
    if isinstance(output, (tuple, list)):
        found = [(f"output[{i}]", v) for i, v in enumerate(output) if scalar(v)]
        return found[0] if found else None
    return None


def default_loss(output: Any, target: Any = None) -> torch.Tensor:
    """The objective when the model file defines no loss_fn: the model's own loss when its output
    holds one (`own_loss`), else the mean of squares of the outputs."""
    own = own_loss(output)
    if own is not None:
        return own[1]
    floats = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        raise GraphsplitError("the model's output holds no floating-point tensor to train on; define loss_fn(output, target)")
    return sum(t.float().square().mean() for t in floats)  # type: ignore[return-value]


def objective(program: Program, user_loss: LossFn | None) -> str:
    """What training minimizes, in words (`run` prints it): the user's loss_fn, the model's own loss
    (found in the traced output's structure, as `own_loss` finds it at run time), or the stand-in
    mean of squares."""
    if user_loss is not None:
        return "loss_fn"
    outs = program.stages[-1].gm.graph.output_node().args[0]
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    # stand-ins of the last stage's outputs: only their rank and dtype matter here
    stand_ins = [torch.empty((1,) * len(spec.shape), dtype=spec.dtype, device="meta") if spec is not None else None
                 for spec in (info(n).tensor for n in outs)]
    own = own_loss(program.unflatten_output(stand_ins))
    if own is not None:
        return (f"the model's own loss ({own[0]}); micro-batches and replicas are combined as the mean "
                "of their losses")
    return "the mean of squares of the outputs (the model file defines no loss_fn and its output holds no loss)"


def default_target(inputs: Iterable[Any], size: int | None = None) -> torch.Tensor:
    """The stand-in target when the model file defines none (`default_loss` ignores it): one zero
    per example (`size` of them, else dim 0 of the first input), so it splits into micro-batches as
    the batch does."""
    inputs = list(inputs)
    if size is not None:
        device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), None)
        return torch.zeros(size, device=device)
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.dim():
            return torch.zeros(value.shape[0], device=value.device)
    raise GraphsplitError("no batched tensor among example_inputs()")


def make_loss(program: Program, user_loss: LossFn | None, loss_graph: nn.Module | None = None,
              replicas: Any = None) -> LossFn:
    """The last stage's raw output -> the user's output structure -> their loss.

    `loss_graph`: this rank's copy of `program.loss_gm` (the loss rewritten for
    vocab-sharded logits), where ranks share a process; by default the program's own.
    `replicas`: the dp group, for a loss that couples the samples (`BatchDims.whole_loss`): it runs on
    every replica's outputs and targets, gathered (runtime/whole_batch.py)."""
    fn = user_loss or default_loss
    graph = loss_graph if loss_graph is not None else program.loss_gm

    def loss(stage_output: Any, target: Any) -> torch.Tensor:
        if replicas is not None:
            stage_output = gather_replicas(stage_output, stage_output_dims(program), replicas)
            target = gather_replicas(target, program.batch.target_dims(target), replicas)
        # the loss's own factory calls (a contrastive loss's `torch.arange(batch)` labels) on the device of
        # what it reads, as when the model runs as its author runs it
        device = next((t.device for t in pytree.tree_leaves(stage_output) if isinstance(t, torch.Tensor)), None)
        with device if device is not None else contextlib.nullcontext():
            if graph is not None:
                outs = (stage_output,) if isinstance(stage_output, torch.Tensor) else tuple(stage_output)
                value = graph(*outs, target)
            else:
                value = fn(program.unflatten_output(stage_output), target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise GraphsplitError("loss_fn must return a scalar tensor")
        return value

    return loss


@dataclass(frozen=True)
class OptimConfig:
    """How `run` updates the weights: optimizer, learning-rate schedule, gradient clipping.

    `weight_decay` None keeps torch's default (AdamW 0.01, SGD 0); `grad_clip` None: no clipping.
    Bad values fail at construction, naming the flag."""

    optimizer: str = "sgd"
    lr: float = 0.01
    weight_decay: float | None = None
    betas: tuple[float, float] | None = None  # AdamW only; None: torch's (0.9, 0.999)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adamw"):
            raise GraphsplitError(f"unknown optimizer {self.optimizer!r}; choose sgd or adamw")
        if not self.lr >= 0:
            raise GraphsplitError(f"--lr must be at least 0, got {self.lr}")
        if self.weight_decay is not None and not self.weight_decay >= 0:
            raise GraphsplitError(f"--weight-decay must be at least 0, got {self.weight_decay}")
        if self.betas is not None:
            object.__setattr__(self, "betas", tuple(self.betas))  # JSON gives a list
            if self.optimizer != "adamw":
                raise GraphsplitError("--betas applies to --optimizer adamw only")
            if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
                raise GraphsplitError(f"--betas must be two numbers in [0, 1), e.g. 0.9,0.95; got {self.betas}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise GraphsplitError(f"--grad-clip must be a positive max norm, got {self.grad_clip}")
        from .schedule import LR_SCHEDULES

        if self.lr_schedule not in LR_SCHEDULES:
            raise GraphsplitError(f"unknown --lr-schedule {self.lr_schedule!r}; choose {', '.join(LR_SCHEDULES)}")
        if self.warmup_steps < 0:
            raise GraphsplitError(f"--warmup-steps must be at least 0, got {self.warmup_steps}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def make_optimizer(self, params: list[nn.Parameter], shard_over: Any = None) -> torch.optim.Optimizer:
        return make_optimizer(self.optimizer, params, self.lr, self.weight_decay, self.betas, shard_over)


def make_optimizer(name: str, params: list[nn.Parameter], lr: float, weight_decay: float | None = None,
                   betas: tuple[float, float] | None = None, shard_over: Any = None) -> torch.optim.Optimizer:
    """The optimizers `run` offers, by name (None: torch's default for that setting). `shard_over`: a dp
    process group the states are sharded over (ZeRO-1: torch's ZeroRedundancyOptimizer; each replica
    steps its share of the parameters and broadcasts them)."""
    extra: dict[str, Any] = {} if weight_decay is None else {"weight_decay": weight_decay}
    if name == "sgd":
        cls: type[torch.optim.Optimizer] = torch.optim.SGD
    elif name == "adamw":
        cls = torch.optim.AdamW
        if params and all(p.device.type == "cuda" for p in params):
            # one kernel over all parameters instead of the foreach implementation's eight passes: on an
            # H200 the foreach AdamW of a 2.8B-parameter stage took 63 ms a step, three times what one
            # pass over the parameters and their gradient and states takes (bench/gpu_stage.py), as the
            # planner prices it; torchtitan's default too
            extra["fused"] = True
        extra.update({} if betas is None else {"betas": tuple(betas)})
    else:
        raise GraphsplitError(f"unknown optimizer {name!r}; choose sgd or adamw")
    if shard_over is None:
        return cls(params, lr=lr, **extra)
    return states_sharded(cls, params, shard_over, lr=lr, **extra)


def states_sharded(cls: type[torch.optim.Optimizer], params: Iterable[nn.Parameter], group: Any,
                   **kwargs: Any) -> torch.optim.Optimizer:
    """ZeRO-1: `cls` over `params` with its states sharded over the dp `group` (torch's
    ZeroRedundancyOptimizer: each replica steps its share of the parameters, then broadcasts it)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(list(params), optimizer_class=cls, process_group=group, **kwargs)


def named_grads(program: Program, stages: Mapping[int, nn.Module]) -> dict[str, torch.Tensor]:
    """The gradients the modules of `stages` (by stage index) hold, under the original model's
    parameter names (a tp rank's shards); a parameter without one is left out."""
    found: dict[str, torch.Tensor] = {}
    for index, module in stages.items():
        for local, canonical in program.stages[index].param_sources.items():
            g = module.get_parameter(local).grad
            if g is not None:
                found[canonical] = g
    return found


def sync_tied_grads(
    program: Program,
    stages: Mapping[int, nn.Module],
    reduce: Callable[[str, torch.Tensor], None] | None = None,
) -> None:
    """Give every copy of a tied parameter the sum of all copies' gradients.

    Copies in this process are summed here; `reduce(name, tensor)` then sums
    across processes in place (the distributed backend's all-reduce over the
    ranks that hold that parameter). Names are visited in sorted order, so every
    rank issues its collectives in the same order.
    """
    copies: dict[str, list[nn.Parameter]] = {}
    for index, module in stages.items():
        for local, canonical in program.stages[index].param_sources.items():
            # no copy gets a gradient (frozen, or read only under no_grad): the untouched model
            # leaves it None, and a zero sum would still be a gradient (weight decay would act)
            if canonical in program.shared_params and canonical not in program.params_without_grad:
                p = module.get_parameter(local)
                if all(p is not q for q in copies.setdefault(canonical, [])):
                    copies[canonical].append(p)
    for canonical in sorted(copies):
        params = copies[canonical]
        total = torch.zeros_like(params[0])
        for p in params:
            if p.grad is not None:
                total.add_(p.grad)
        if reduce is not None:
            reduce(canonical, total)
        for p in params:
            p.grad = total.clone()
