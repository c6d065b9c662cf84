"""Which parameters each op reads, and what a stage or a span of ops holds of them: whole, an FSDP shard,
or one expert-parallel rank's experts."""

from __future__ import annotations

import numpy as np

from ..ir.regions import StageRegion, fsdp_units
from ..plan import Plan
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
    """Bytes of the parameters each stage holds (a parameter read by two stages counts on both). Found once
    per cut and sharding: the search asks again for every plan sharing them."""
    key = ("held", tuple(bounds), dp, ep, only_experts)
    found = table.cache.get(key)
    if found is not None:
        return found
    pos, which, sizes = uses(table, dp, ep, only_experts)
    count = len(bounds) - 1
    if not len(sizes):
        found = np.zeros(count, dtype=np.int64)
    else:
        pairs = np.unique(stage_of(bounds, pos) * len(sizes) + which)
        found = np.bincount(pairs // len(sizes), weights=sizes[pairs % len(sizes)], minlength=count).astype(np.int64)
    table.cache[key] = found
    return found


def stage_of(bounds: list[int], positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(bounds[1:-1]), positions, side="right")


def unit_bytes(table: OpTable, plan: Plan, spans: list[tuple[int, int]]) -> np.ndarray:
    """Bytes of the parameters the ops of each span [lo, hi) of a stage read, for the spans FSDP shards as
    units of their own under `plan` (0 for the others): the program's choice over its regions
    (ir/regions.py: `fsdp_units`), here over spans of ops and parameters by index."""
    pos, which, sizes = uses(table)
    regions, inside_any = [], np.zeros(len(pos), dtype=bool)
    for i, (lo, hi) in enumerate(spans):
        inside = (pos >= lo) & (pos < hi)
        inside_any |= inside
        regions.append(StageRegion(str(i), frozenset(np.unique(which[inside]).tolist())))
    units = {r.name for r in fsdp_units(plan, regions, np.unique(which[~inside_any]).tolist())}
    return np.array([int(sizes[sorted(r.reads)].sum()) if r.name in units else 0 for r in regions], dtype=np.int64)
