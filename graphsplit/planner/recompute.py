"""What a stage keeps for backward under each checkpoint policy, and what backward recomputes.

Activations kept for backward under each checkpoint policy, per stage:

- none: what every op keeps (measured per op on meta, each storage once per stage);
- blocks / every:K: each region (a run of K repeated blocks inside the stage)
  keeps its inputs: the previous block's output, and once per stage the values
  the head shares with every block (masks, rotary tables); a block the stage
  boundary cuts keeps what crossed the boundary; ops before the first block keep
  what they keep; ops after a block join its region (the final norm and LM head);
  a region without FLOPs is not checkpointed (passes/activation_checkpoint.py);
- selective: each block keeps its inputs and the outputs of its matmul-class ops;
- stage: the stage's inputs;
- attention: each written-out attention core keeps what it reads (queries, keys, values, the mask),
  the other ops what they keep.

With a policy, backward recomputes each region once: its full activations are
live meanwhile (the largest region's count towards the peak), and its forward
runs again, tp collectives included (selective: only the ops whose outputs it did
not keep, and every collective).

The search asks for tens of thousands of stages, a few thousand shapes among them,
on several variants of each table (`stages.as_run`): a shape's regions, the storages
they keep and where their recomputes stop follow from the op sequence alone, and are
laid out once per table (`OpTable.structure`, which the variants share); only the
bytes and seconds are read per variant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import checkpoint_policy
from .table import OpTable


def _regions(table: OpTable, a: int, e: int, per: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Checkpoint regions of stage [a, e): runs of `per` consecutive blocks, each extended over the
    non-block ops after it; and the ops outside every region (those before the first block)."""
    block = table.block[a:e]
    inside = np.flatnonzero(block >= 0)
    if not len(inside):
        return [], list(range(a, e))
    # where a new block begins: a block op whose block differs from the block op before it
    ids = block[inside]
    begins = inside[np.concatenate([[True], ids[1:] != ids[:-1]])] + a
    starts = begins[::per].tolist()
    regions = list(zip(starts, [*starts[1:], e]))
    outside = list(range(a, starts[0]))
    # the pass checkpoints no region without FLOPs (a partial block of elementwise ops): its ops run plainly
    key = ("flops_before",)
    before = table.cache.get(key)
    if before is None:
        before = table.cache[key] = np.concatenate([[0], np.cumsum((table.flops[0] + table.flops[1]) > 0)])
    plain = [r for r in regions if before[r[1]] == before[r[0]]]
    for lo, hi in plain:
        outside.extend(range(lo, hi))
    return [r for r in regions if r not in plain], outside


def region_spans(table: OpTable, policy: str, a: int, e: int) -> list[tuple[int, int]]:
    """The checkpointed regions of stage [a, e) under `policy` (the program's CheckpointRegion modules)."""
    if policy in ("none", "stage"):
        return [] if policy == "none" else [(a, e)]
    return _policy_regions(table, policy, a, e)[0]


def _policy_regions(table: OpTable, policy: str, a: int, e: int) -> tuple[list[tuple[int, int]], list[int]]:
    """`_regions` under a block policy (blocks, every:K, first:N, selective): first:N's other blocks
    run plainly, among the ops outside every region."""
    parsed = checkpoint_policy(policy)
    if parsed.kind == "attention":
        return _cores(table, a, e)
    regions, outside = _regions(table, a, e, parsed.count if parsed.kind == "every" else 1)
    if parsed.kind == "first":  # the first N blocks recomputed, the others keep their activations
        count = parsed.count
        outside = [*outside, *(i for lo, hi in regions[count:] for i in range(lo, hi))]
        regions = regions[:count]
    return regions, outside


def _cores(table: OpTable, a: int, e: int) -> tuple[list[tuple[int, int]], list[int]]:
    """`--checkpoint attention`'s regions in stage [a, e): each attention core whole inside it; the other
    ops outside every region (a core the stage boundary cuts runs plainly, as the pass leaves it)."""
    core = table.core[a:e] if table.core is not None else np.full(e - a, -1)
    regions: list[tuple[int, int]] = []
    outside: list[int] = []
    i = 0
    while i < e - a:
        j = i + 1
        while j < e - a and core[j] == core[i]:
            j += 1
        whole = core[i] >= 0 and (a + i == 0 or table.core[a + i - 1] != core[i]) and \
            (a + j == table.n or table.core[a + j] != core[i])
        if whole:
            regions.append((a + i, a + j))
        else:
            outside.extend(range(a + i, a + j))
        i = j
    return regions, outside


@dataclass(frozen=True)
class _Layout:
    """Stage [a, e) under a block policy, as far as the op sequence alone decides it: the storages its ops
    outside every region keep, and per region (lo, hi, where its recompute stops early, the block whose
    inputs it keeps or -1 where the stage boundary cuts the block, what crossed that boundary as
    (per sample, constant) pairs, and [lo, hi) moved back to the copy it prices as (`_region`))."""

    outside: np.ndarray
    regions: tuple[tuple[int, int, int, int, tuple[tuple[int, int], ...], int, int], ...]


def _layout(table: OpTable, policy: str, a: int, e: int) -> _Layout:
    key = ("layout", policy, a, e)
    found = table.structure.get(key)
    if found is not None:
        return found
    regions, outside = _policy_regions(table, policy, a, e)
    cores = checkpoint_policy(policy).kind == "attention"
    laid = []
    for lo, hi in regions:
        bi, crossed = int(table.block[lo]), ()
        if cores:  # a core keeps what it reads from before it: the queries, keys, values and mask
            crossed = tuple((ps, c) for _, ps, c in
                            {(vid, ps, c) for i in range(lo, hi) for vid, at, ps, c in table.reads[i] if at < lo})
            bi = -1
        elif lo == a and a > 0 and int(table.block[a - 1]) == bi:
            # a block the stage boundary cuts keeps what crossed the boundary and it reads (each value once:
            # the set, iterated in the order it always was, so sums at a fractional b come out the same)
            crossed = tuple((ps, c) for _, ps, c in
                            {(vid, ps, c) for i in range(lo, hi) for vid, at, ps, c in table.reads[i] if at < a})
            bi = -1
        shift = _region_shift(table, lo, hi)
        laid.append((lo, hi, table.recompute_stop(lo, hi), bi, crossed, lo - shift, hi - shift))
    found = table.structure[key] = _Layout(table.kept_ids(outside), tuple(laid))
    return found


def policy_kept(table: OpTable, policy: str, a: int, e: int, b: int, secs: np.ndarray, comm: np.ndarray,
                early_stop: bool = True) -> tuple[int, int, float, int, float]:
    """(kept for backward, the largest region's activations, recompute seconds, what its regions keep
    once recomputed, the tp collectives among the recompute's seconds) of stage [a, e). `early_stop`:
    a recompute ends at the region's last op that keeps anything (`OpTable.recompute_stop`), as torch's
    checkpoint does; a split-backward schedule's region runs whole (ops/activation_checkpoint.py)."""
    if policy == "none":
        return table.saved(range(a, e), b), 0, 0.0, 0, 0.0
    if policy == "stage":
        whole = table.saved(range(a, e), b)
        stop = table.recompute_stop(a, e) if early_stop else e
        return int(table.at(table.live, b)[a]), whole, float(secs[a:stop].sum()), whole, float(comm[a:stop].sum())
    parsed = checkpoint_policy(policy)
    selective = parsed.count if parsed.kind == "selective" else 0  # keeps one matmul output in K
    layout = _layout(table, policy, a, e)
    kept, peak, recompute, shared, recomputed, again = table.saved_bytes(layout.outside, b), 0, 0.0, 0, 0, 0.0
    for lo, hi, stop, bi, crossed, moved_lo, moved_hi in layout.regions:
        if bi < 0:
            kept += sum(ps * b + c for ps, c in crossed)
        else:
            (stream, common) = table.block_inputs[bi]
            kept += stream[0] * b + stream[1]
            shared = max(shared, common[0] * b + common[1])
        add, region_peak, region_recompute = _region_at(table, moved_lo, moved_hi, b, secs, comm, selective,
                                                        early_stop)
        kept += add
        peak = max(peak, region_peak)
        recompute += region_recompute
        recomputed += region_peak
        # every collective of the recomputed ops runs again (selective: those of its blocks' ops, kept or not)
        stop = stop if early_stop else hi
        again += float(comm[lo:stop][table.block[lo:stop] >= 0].sum() if selective else comm[lo:stop].sum())
    return kept + shared, peak, recompute, recomputed, again


def _region_shift(table: OpTable, lo: int, hi: int) -> int:
    """`stage_shifts` of one region, in plain Python."""
    if table.period is None:
        return 0
    first, length, end = table.period
    k = (lo - first) // length
    return (k - 2) * length if lo >= first and k > 2 and hi <= end - length else 0


def _region(table: OpTable, lo: int, hi: int, b: int, secs: np.ndarray, comm: np.ndarray, selective: int,
            early_stop: bool = True) -> tuple[int, int, float]:
    """One checkpoint region [lo, hi): (what it keeps beyond its inputs, its activations while it is
    recomputed, its recompute seconds); priced once per shape, as stages are (`stage_shifts`). `selective`:
    0, recomputed whole; K, its blocks' ops keep their attention outputs and one matmul output in K."""
    shift = _region_shift(table, lo, hi)
    return _region_at(table, lo - shift, hi - shift, b, secs, comm, selective, early_stop)


def _region_at(table: OpTable, lo: int, hi: int, b: int, secs: np.ndarray, comm: np.ndarray, selective: int,
               early_stop: bool) -> tuple[int, int, float]:
    """`_region` of [lo, hi), already moved back to the copy it prices as."""
    key = ("region", selective, early_stop, lo, hi, b, id(secs))  # secs: cached per (b, hardware)
    found = table.cache.get(key)
    if found is not None:
        return found
    stop = table.recompute_stop(lo, hi) if early_stop else hi
    in_blocks = table.block[lo:hi] >= 0
    ran = np.arange(lo, hi) < stop  # the ops the recompute runs
    if selective:
        share = _kept_share(table, lo, hi, selective) * in_blocks  # of each op's outputs, what it keeps
        keeps = share > 0
        chosen = table.at(table.selective, b)[lo:hi]
        if selective > 1:  # attention's outputs whole, each op's matmul outputs by the share it keeps
            attention = table.at(table.selective_attention, b)[lo:hi]
            matmul = table.matmul_calls[lo:hi] > 0
            chosen = np.where(matmul, attention + (chosen - attention) * share, chosen)
        found = (int(chosen[in_blocks].sum()) + table.saved(lo + np.flatnonzero(~in_blocks), b),
                 table.saved(lo + np.flatnonzero(in_blocks), b),
                 # what it did not keep, and the collectives of those it kept (a kept matmul's gather)
                 float((secs[lo:hi] * (1 - share))[in_blocks & ran].sum() + comm[lo:hi][keeps & ran].sum()))
    else:
        found = (0, table.saved(range(lo, hi), b), float(secs[lo:stop].sum()))
    table.cache[key] = found
    return found


def _kept_share(table: OpTable, lo: int, hi: int, every: int) -> np.ndarray:
    """Per op of a selective region [lo, hi), the share of its matmul-class outputs the region keeps: 1 for
    every matmul-class op (attention too) at `every` 1; at K, one matmul call in K, counted in order from
    the region's first (ops/activation_checkpoint.py: SelectiveKeeps), attention's always."""
    compute = table.compute[lo:hi].astype(float)
    if every == 1:
        return compute
    calls = table.matmul_calls[lo:hi]
    before = np.concatenate([[0], np.cumsum(calls)[:-1]])
    # the calls an op makes are indices before .. before + calls - 1; those at multiples of K are kept
    kept = (before + calls + every - 1) // every - (before + every - 1) // every
    return np.where(calls > 0, kept / np.maximum(calls, 1), compute)


def stage_shifts(table: OpTable, bounds: np.ndarray) -> np.ndarray:
    """How far each stage [a, e) of `bounds` can move back and cost the same: a stage inside the
    repeated blocks, from the third copy on, prices as the same ops two copies in (copy 1 reads block
    0, copy 2 a copy). The last copy is never moved: the head's shared values (rotary tables, masks)
    die in it."""
    a, e = bounds[:-1], bounds[1:]
    if table.period is None:
        return np.zeros(len(a), dtype=np.int64)
    first, length, end = table.period
    k = (a - first) // length
    return np.where((a >= first) & (k > 2) & (e <= end - length), (k - 2) * length, 0)
