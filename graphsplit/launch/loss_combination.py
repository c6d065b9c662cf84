"""What `run` says about how the pieces' losses are combined, where a mean over counted tokens makes
that matter (passes/token_mean.py normalizes the ones it proves; analysis/loss_reduction.py)."""

from __future__ import annotations

from ..ir.program import Program


def combination_notes(program: Program) -> list[str]:
    """When the plan cuts the batch into several pieces: one line per mean over counted tokens (in the
    model's graph or in loss_fn), saying it is normalized by the global count or, where graphsplit
    cannot prove how it reduces, that the pieces' losses are averaged as equals; one line when loss_fn
    cannot be read."""
    plan = program.plan
    pieces = plan.dp * plan.num_microbatches
    means = program.token_means
    if pieces == 1 or means is None or program.batch.whole_loss:  # one loss on the whole batch: said in its own note
        return []
    equals = f"the losses of the {pieces} pieces of the batch (micro-batches x replicas) are averaged as equals"
    notes = [f"the {c.what} {c.where} sums over the whole global batch: each of the {pieces} pieces (micro-batches "
             "x replicas) adds its own sum, so loss and gradients are the whole batch's"
             if c.what.startswith("summed ") else
             f"the {c.what} {c.where} is normalized by the tokens it counts in the whole global batch: each of the "
             f"{pieces} pieces (micro-batches x replicas) adds its sum over that count, so loss and gradients are the "
             "whole batch's" for c in means.counts]
    if means.loss_untraced:
        notes.append(f"loss_fn does not trace, so graphsplit cannot see how it reduces: {equals}")
    notes += [f"{u}; so {equals}, which is the whole batch's loss only when every piece counts as many tokens"
              for u in means.unproven]
    return notes
