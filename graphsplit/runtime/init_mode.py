"""Which initialization `run` uses without a weights file: exact or fast (`--init exact|fast|auto`).

exact (exact_init.py): the model's own constructor with the plan's seed on every rank, each
keeping only its parameters; the values are the untouched model's to the bit, and each rank
draws every random number of the whole model (about 7.5 s per billion parameters on one CPU
thread). fast (fast_init.py): each rank draws only its own blocks, on its device, with the
same values at every plan, from the distributions the modules' own init uses.

auto: exact with --check (the reference is the untouched model as its constructor makes it)
and below `FAST_INIT_ABOVE` parameters, where exact costs a few seconds; fast above, when
every parameter has a fast rule (otherwise exact, saying why).
"""

from __future__ import annotations

import torch.nn as nn

from ..errors import GraphsplitError
from .fast_init import model_rules, unsupported

INIT_MODES = ("auto", "exact", "fast")
# exact costs ~7.5 s per billion parameters per rank: 500M is about 4 s
FAST_INIT_ABOVE = 500_000_000


def choose_init(requested: str, meta_model: nn.Module, check: bool) -> tuple[str, str]:
    """("exact" | "fast", the reason, one line for the log) for a model built on meta."""
    if requested not in INIT_MODES:
        raise GraphsplitError(f"--init {requested!r}: choose one of {', '.join(INIT_MODES)}")
    missing = unsupported(meta_model, model_rules(meta_model))
    if requested == "fast":
        if missing:
            raise GraphsplitError(f"--init fast: no fast init rule for parameter {missing[0]!r} "
                                  f"({len(missing)} in all; the modules' own init is not known); use --init exact")
        return "fast", "fast (asked for): each rank draws only its own blocks"
    if requested == "exact":
        return "exact", "exact (asked for)"
    n = sum(p.numel() for p in meta_model.parameters())
    size = f"{n / 1e6:.1f}M parameters"
    if check:
        return "exact", f"exact: --check compares against the constructor's own init ({size})"
    if n < FAST_INIT_ABOVE:
        return "exact", f"exact: {size}, below {FAST_INIT_ABOVE / 1e6:.0f}M where fast init starts"
    if missing:
        return "exact", f"exact: {size}, but no fast init rule for {missing[0]!r} ({len(missing)} in all)"
    return "fast", f"fast: {size}, at or above {FAST_INIT_ABOVE / 1e6:.0f}M; each rank draws only its own blocks"
