"""What `run` says about how the pieces' losses are combined, where that can differ from the loss
of the whole batch (analysis/loss_reduction.py)."""

from __future__ import annotations

from ..analysis.loss_reduction import token_means
from ..ir.program import Program
from ..passes.vocab_parallel_loss import trace_loss
from ..runtime.training import LossFn


def combination_notes(program: Program, user_loss: LossFn | None) -> list[str]:
    """One line per token-mean loss (in the model's graph or in loss_fn) when the plan cuts the batch
    into several pieces, and one when loss_fn cannot be read."""
    plan = program.plan
    pieces = plan.dp * plan.num_microbatches
    if pieces == 1:
        return []
    where = [f"at {line}" for line in token_means(program.traced.gm)]
    if user_loss is not None:
        tensors = len({v for kind, v in program.output_leaves if kind == "tensor"})
        try:
            loss_gm = trace_loss(user_loss, program.traced.out_spec, program.output_leaves, tensors)
        except Exception:  # any tracer failure: say what is done instead of what the loss is
            return [f"loss_fn does not trace, so graphsplit cannot see how it reduces: the losses of the {pieces} "
                    "pieces of the batch (micro-batches x replicas) are averaged as equals"]
        where += ["in loss_fn" for _ in token_means(loss_gm)]
    return [f"the cross-entropy {w} averages over the tokens its piece counts, and the {pieces} pieces' losses "
            "(micro-batches x replicas) are averaged as equals: that is the whole batch's loss only when every "
            "piece counts as many tokens (uneven padding or ignore_index makes them differ; normalizing by the "
            "global token count is not built yet)" for w in where]
