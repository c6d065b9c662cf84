"""graphsplit: turn an ordinary nn.Module into a pipeline / tensor / data-parallel training program.

    from graphsplit import parallelize, Plan
    module = parallelize(model, Plan(pp=2), example_inputs=(idx,))   # inside torchrun
    loss = module.train_step(idx, target=targets)
"""

from .api import PipelinedModule, TransformResult, parallelize, price, transform
from .errors import GraphsplitError
from .plan import Plan

__all__ = ["GraphsplitError", "PipelinedModule", "Plan", "TransformResult", "parallelize", "price", "transform"]
