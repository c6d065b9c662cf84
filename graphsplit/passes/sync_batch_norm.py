"""sync_batch_norm: with `--sync-bn`, BatchNorm layers take their statistics over all dp replicas.

Each BatchNorm module the graph calls is swapped for `DataParallelBatchNorm`
(ops/sync_batch_norm.py) holding the same parameter and buffer objects, so names,
values and the call site in the stage code stay as they were. A model that
calls batch_norm as a function (or an exported graph, where BatchNorm is an
aten op on buffers) is refused with the module's name: there is no layer to swap.
"""

from __future__ import annotations

import torch.fx as fx
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import GraphsplitError
from ..ir.meta import info
from ..ir.op_kinds import OpKind, classify
from ..ops.sync_batch_norm import DataParallelBatchNorm
from .manager import PassInput, PassResults


def sync_batch_norm_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, None]:
    if not inp.plan.sync_bn:
        return gm, None
    swapped = 0
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            if isinstance(module, _BatchNorm):
                if not isinstance(module, DataParallelBatchNorm):
                    gm.set_submodule(str(node.target), DataParallelBatchNorm.replacing(module))
                swapped += 1
        elif node.op == "call_function" and classify(node, gm) == OpKind.NORM and "batch_norm" in str(node.target):
            where = info(node).module or node.name
            raise GraphsplitError(f"--sync-bn: {where} calls batch_norm as a function, not through a BatchNorm "
                                  "layer graphsplit can swap; use nn.BatchNorm*d there or drop --sync-bn")
    if not swapped:
        raise GraphsplitError("--sync-bn: the model has no BatchNorm layer; drop --sync-bn")
    return gm, None
