"""Which batch the untouched model runs on for `--check`: the whole global batch, unless the model's
own definition makes it depend on how the batch is cut (BatchNorm below; under --fp8, float8's scales
of activations, which are each piece's).

The bar is the untouched model on the whole global batch, one forward and one backward: a
reference run on graphsplit's own micro-batches shares graphsplit's choices (its batch dim, its
cut) and proves nothing. One kind of module legitimately differs: a BatchNorm in training mode takes
its statistics over the batch it is given, so the program (each micro-batch, each dp replica, or
with --sync-bn the replicas' m-th micro-batches joined) computes what the model computes per
piece. There the check names the modules, says why, and compares with the untouched model run on
those pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..plan import Plan


@dataclass(frozen=True)
class ReferenceBatch:
    """How the reference cuts the global batch: `pieces` (dp replicas x micro-batches, replica-major),
    with `replicas` > 1 the replicas' m-th micro-batches joined (reference.reference_step's arguments);
    `why`: the reason it is not the whole batch."""

    pieces: int = 1
    replicas: int = 1
    why: str = ""

    @property
    def whole(self) -> bool:
        return self.pieces // self.replicas == 1

    def describe(self) -> str:
        if self.whole:
            return "on the whole global batch (one forward, one backward)"
        per = self.pieces // self.replicas
        joined = f", each joining the {self.replicas} replicas' shares" if self.replicas > 1 else ""
        return f"on the program's {per} micro-batches{joined}"


def batch_statistics_modules(model: nn.Module) -> list[str]:
    """The modules whose output depends on the other samples of the batch they are given: BatchNorm
    layers that normalize with the batch's statistics (training mode, or no running statistics)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and (m.training or not m.track_running_stats)]


def reference_batch(model: nn.Module, plan: Plan) -> ReferenceBatch:
    """The whole global batch, or (BatchNorm with the batch cut) the pieces whose statistics the
    program's BatchNorms compute, with the reason."""
    pieces = plan.dp * plan.num_microbatches
    if plan.fp8 is not None and pieces > 1:
        return ReferenceBatch(pieces, 1, f"--fp8 scales each float8 activation and output gradient by the amax of "
                                         f"the values a rank holds, each of the program's {pieces} pieces (as "
                                         "torchao's under DDP or FSDP), so the whole batch's scales legitimately differ")
    norms = batch_statistics_modules(model)
    if pieces == 1 or not norms:
        return ReferenceBatch()
    replicas = plan.dp if plan.sync_bn else 1
    if pieces == replicas:  # --sync-bn, one micro-batch per replica: the statistics of the whole batch
        return ReferenceBatch()
    shown = ", ".join(norms[:4]) + (f" and {len(norms) - 4} more" if len(norms) > 4 else "")
    if plan.sync_bn:
        cut = f"{plan.num_microbatches} micro-batches (joined over the {plan.dp} replicas by --sync-bn)"
    elif plan.dp > 1 and plan.num_microbatches > 1:
        cut = f"{plan.dp} replicas x {plan.num_microbatches} micro-batches"
    elif plan.dp > 1:
        cut = f"{plan.dp} replicas (no --sync-bn)"
    else:
        cut = f"{plan.num_microbatches} micro-batches"
    why = (f"BatchNorm {shown} normalize with the statistics of the batch they are given, and the program "
           f"gives them {cut}, so the whole batch's result legitimately differs (the model's own semantics)")
    return ReferenceBatch(pieces, replicas, why)
