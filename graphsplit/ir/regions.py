"""A stage's regions (its blocks, checkpointed or run plainly) and which of them FSDP shards as units.

The one FSDP unit policy: the program's stages carry their regions (`StageProgram.regions`, filled where
the graph is cut into stages), the backend shards the units `fsdp_units` picks, the report lists them, and
the planner prices the same choice over its spans of ops, its parameters keyed by index instead of name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from ..plan import Plan


@dataclass(frozen=True)
class StageRegion:
    """A region of a stage: its name (`ckpt_3`, `block_0`) and the parameters its ops read, each named by
    one key (a stage's parameter under its canonical name, so tied copies are one; the planner's index)."""

    name: str
    reads: frozenset[Hashable]


def fsdp_units(plan: Plan, regions: Sequence[StageRegion], read_outside: Iterable[Hashable]) -> list[StageRegion]:
    """The regions FSDP shards as units of their own under `plan`, in order (the rest of the stage is one
    more unit): none unless the plan shards per region (`Plan.fsdp_per_region`); else each region reading
    parameters that nothing else in the stage reads. FSDP shards a parameter in one unit, so a region
    holding a weight tied to one outside it (a tied LM head: `read_outside`), or read by two regions,
    stays in the stage's unit."""
    if not plan.fsdp_per_region:
        return []
    readers = Counter(key for region in regions for key in region.reads)
    outside = set(read_outside)
    return [r for r in regions
            if r.reads and all(readers[key] == 1 and key not in outside for key in r.reads)]
