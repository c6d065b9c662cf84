"""Which parameters each op reads, and what a stage or a span of ops holds of them: whole, an FSDP shard,
or one expert-parallel rank's experts."""

from __future__ import annotations

import numpy as np

from .table import OpTable


def uses(table: OpTable, dp: int = 1, ep: int = 1,
         only_experts: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(op position, parameter index) of every parameter read, and each parameter's bytes: whole, or
    (dp > 1) the first FSDP shard of it (dim 0 cut in dp pieces, rounded up, as DTensor cuts it); an
    expert weight under expert parallelism (ep > 1) one ep rank's experts. `only_experts`: the expert
    weights alone (the rest count 0)."""
    key = ("uses", dp, ep, only_experts)
    if key not in table.cache:
        experts = table.expert_params()
        names = sorted({name for here in table.params for name in here})
        index = {name: i for i, name in enumerate(names)}
        pos = np.array([i for i, here in enumerate(table.params) for _ in here], dtype=np.int64)
        which = np.array([index[name] for here in table.params for name in here], dtype=np.int64)
        sizes = []
        for name in names:
            shape, whole = table.param_shapes[name], table.param_bytes[name]
            if only_experts and name not in experts:
                sizes.append(0)
            elif ep > 1 and name in experts:
                sizes.append(whole // ep)
            elif dp > 1 and shape:
                per_row = whole // max(shape[0], 1) if shape[0] else 0
                sizes.append(min(-(-shape[0] // dp), shape[0]) * per_row)
            else:
                sizes.append(whole)
        table.cache[key] = (pos, which, np.array(sizes, dtype=np.int64))
    return table.cache[key]


def held(table: OpTable, bounds: list[int], dp: int = 1, ep: int = 1, only_experts: bool = False) -> np.ndarray:
    """Bytes of the parameters each stage holds (a parameter read by two stages counts on both)."""
    pos, which, sizes = uses(table, dp, ep, only_experts)
    count = len(bounds) - 1
    if not len(sizes):
        return np.zeros(count, dtype=np.int64)
    pairs = np.unique(stage_of(bounds, pos) * len(sizes) + which)
    return np.bincount(pairs // len(sizes), weights=sizes[pairs % len(sizes)], minlength=count).astype(np.int64)


def stage_of(bounds: list[int], positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(bounds[1:-1]), positions, side="right")


def unit_bytes(table: OpTable, spans: list[tuple[int, int]]) -> np.ndarray:
    """Bytes of the parameters the ops of each span [lo, hi) read, for the spans whose parameters no op
    outside the span reads (0 for the others): the FSDP units a stage's checkpointed regions become
    (backends/parallelize.py: `fsdp_regions`; a region with a tied weight stays in the stage's unit)."""
    pos, which, sizes = uses(table)
    found = np.zeros(len(spans), dtype=np.int64)
    for i, (lo, hi) in enumerate(spans):
        inside = (pos >= lo) & (pos < hi)
        mine = np.unique(which[inside])
        if not np.isin(mine, which[~inside]).any():
            found[i] = int(sizes[mine].sum())
    return found
