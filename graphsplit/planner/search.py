"""The search: every plan worth considering, priced from one profile of the model.

Candidates: tp within a node (dividing the devices and the model's heads),
pp up to the model's places to cut, dp the rest; DDP or FSDP, or for a mixture of experts DDP with
expert parallelism over ep of the dp ranks (ep dividing the experts; with DDP or FSDP for the rest); micro-batch counts
that divide each replica's batch; the schedules torch.distributed.pipelining
runs (interleaved ones with 2, 4 or 8 stages per rank; the zero-bubble ones up to pp 16); checkpoint none, selective,
blocks, every:2, every:4 or stage; autocast none, bf16 or fp16 (fp16 only on hardware without bf16:
elsewhere it prices as bf16 and needs a loss scaler); each stage under torch.compile
or eager. Nothing is compiled per candidate: each is priced from the profile's per-op sums (profile.py), so the
search over tens of thousands of plans takes seconds. Plans that cannot work are
counted with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from typing import Any

from ..errors import GraphsplitError
from ..plan import Plan, divisors, rounds_fit
from .estimate import Estimate, estimate, plan_memory
from .hardware import Hardware
from .links import send_flops_per_byte
from .parallel import Workers
from .profile import build_all_tables
from .schedules import ORDERED_SCHEDULES
from .stages import plan_stages

SCHEDULE_CHOICES: tuple[tuple[str, int], ...] = (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2),
                                                 ("interleaved-1f1b", 4), ("interleaved-1f1b", 8),
                                                 ("looped-bfs", 2), ("zero-bubble", 2), ("zbv", 2), ("dualpipev", 2))
# the zero-bubble schedules are priced from torch's own action order (planner/schedules.py), which
# torch builds in Python: tried up to pp 16, where building it stays well under a second
ZERO_BUBBLE_MAX_PP = 16
CHECKPOINT_CHOICES = ("none", "selective", "selective:2", "first:1", "first:2", "blocks", "every:2", "every:4", "stage")
AUTOCAST_CHOICES: tuple[str | None, ...] = (None, "bf16", "fp16")
# torch.compile of each stage (Plan.compile): elementwise ops fused between the matmuls (stages.fused_seconds)
COMPILE_CHOICES = (False, True)
MICROBATCH_EACH_END = 4  # micro-batch counts tried at each end of a replica's many divisors
EP_CHOICES = 3  # expert-parallel degrees tried per dp: the largest that divide it and the experts
# context parallelism is tried for sequences this long (Llama 3 trained at 8K tokens without it and used it
# from its long-context stages on), or where the batch has fewer samples than the dp ranks: up to
# CP_CHOICES degrees each (the smallest: each exchange grows with cp)
LONG_SEQUENCE = 16384
CP_CHOICES = 3
# memory graphsplit does not model (the CUDA context, allocator fragmentation) is left free
USABLE_FRACTION = 0.95


@dataclass
class SearchResult:
    fits: bool
    plans: list[Estimate]  # best first
    closest: Estimate | None  # the plan needing the least memory, when nothing fits
    too_large: str | None  # which memory part dominates it
    devices_needed: int | None
    considered: int
    left_out: Counter[str] = field(default_factory=Counter)  # reason -> count
    search_seconds: float = 0.0
    no_cp: str = ""  # a long sequence context parallelism cannot cut: why

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fits": self.fits,
            "plans": [e.to_dict() for e in self.plans[:top]],
            "considered": self.considered,
            "left_out": dict(self.left_out),
            "search_seconds": self.search_seconds,
        }
        if not self.fits:
            out.update(closest=self.closest.to_dict() if self.closest else None, too_large=self.too_large,
                       devices_needed=self.devices_needed)
        return out


def cp_degrees(dp: int, batch: int, sequence: int) -> list[int]:
    """The context-parallel degrees tried at `dp` (cp drawn from it): 1, and where the sequence is long
    (`LONG_SEQUENCE`) or the batch has fewer samples than dp ranks, the smallest `CP_CHOICES` degrees
    that cut the sequence into 2 x cp equal chunks and leave a whole share of the batch per sample replica."""
    if not sequence or (sequence < LONG_SEQUENCE and batch % dp == 0):
        return [1]
    found = [c for c in divisors(dp) if c > 1 and sequence % (2 * c) == 0 and batch % (dp // c) == 0]
    return [1, *found[:CP_CHOICES]]


SendWeight = Callable[[int, bool], float]  # (tp, low precision) -> Plan.send_flops_per_byte


def candidates(gpus: int, gpus_per_node: int, batch: int, max_stages: int, has_blocks: bool,
               left_out: Counter[str], experts: int = 0, sequence: int = 0, has_cores: bool = False,
               send: SendWeight | None = None) -> Iterator[Plan]:
    """Every plan shape for `gpus` devices; the ones that cannot work are counted in `left_out`.
    `experts`: what every MoE layer's expert count divides (0: none), for the expert-parallel degrees
    (drawn from dp); `sequence`: the length context parallelism may cut (0: none), for its degrees
    (drawn from dp too); `has_cores`: it has written-out attention, which `--checkpoint attention` recomputes;
    `send`: what a byte sent between stages weighs in a pipelined candidate's cut (links.send_flops_per_byte)."""
    for tp in divisors(min(gpus, gpus_per_node)):
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            for cp in cp_degrees(dp, batch, sequence):
                if batch % (dp // cp):
                    left_out[f"batch {batch} cannot be shared by dp={dp} replicas"] += 1
                    continue
                yield from _shapes(tp, pp, dp, cp, batch, max_stages, has_blocks, left_out, experts, has_cores, send)


def _shapes(tp: int, pp: int, dp: int, cp: int, batch: int, max_stages: int, has_blocks: bool,
            left_out: Counter[str], experts: int, has_cores: bool = False,
            send: SendWeight | None = None) -> Iterator[Plan]:
    """The candidates of one (tp, pp, dp, cp) mesh: schedules, micro-batches, checkpointing, precision,
    sharding, compile, sequence parallelism."""
    per_replica = batch // (dp // cp)
    schedules = [("1f1b", 1)] if pp == 1 else list(SCHEDULE_CHOICES)
    for (schedule, v), m in itertools.product(schedules, microbatch_counts(per_replica, pp)):
        if pp * v > max_stages:
            left_out[f"too few places to cut for {pp * v} stages"] += 1
            continue
        if pp > 1 and m < pp:
            left_out["fewer micro-batches than pipeline stages"] += 1
            continue
        if pp == 1 and m > 1:
            continue  # no pipeline: micro-batches only cost time
        if v > 1 and not rounds_fit(schedule, pp, m):
            left_out["an interleaved schedule needs micro-batches its rounds divide"] += 1
            continue
        if schedule in ORDERED_SCHEDULES and pp > ZERO_BUBBLE_MAX_PP:
            left_out[f"zero-bubble schedules are tried up to pp {ZERO_BUBBLE_MAX_PP}"] += 1
            continue
        if schedule == "dualpipev" and m < pp * v:
            left_out["dualpipev needs a micro-batch per stage"] += 1
            continue
        checkpoints = (*(CHECKPOINT_CHOICES if has_blocks else ("none", "stage")), *(("attention",) if has_cores else ()))
        # the three largest degrees: most of the expert weights' memory saved, the all-to-all
        # growing slowly with ep (the search stays seconds, not minutes, on 256 experts)
        eps = [e for e in divisors(dp) if e > 1 and experts % e == 0][-EP_CHOICES:] if experts and cp == 1 else []
        # (fsdp, ep, zero): ZeRO-2 differs from ZeRO-3 only where there is no pipeline (one stage)
        zeros = (None, 2) if pp * v == 1 else (None,)
        # ZeRO-1 beside plain DDP (its states a dp-th each, its parameters gathered after the step)
        sharding = [(False, 1, None), *([(False, 1, 1)] if dp > 1 else []), *((True, 1, z) for z in zeros if dp > 1),
                    *((f, e, z) for e in eps for f, z in ((False, None), *((True, z) for z in zeros)))]
        weights = {low: send(tp, low) if send is not None and pp * v > 1 else None for low in (False, True)}
        for checkpoint, autocast, (fsdp, ep, zero), compiled, sp in itertools.product(
                checkpoints, AUTOCAST_CHOICES, sharding, COMPILE_CHOICES, (False, True) if tp > 1 else (False,)):
            try:
                yield Plan(tp=tp, pp=pp, dp=dp, fsdp=fsdp, zero=zero, ep=ep, cp=cp, microbatches=m if pp > 1 else None,
                           schedule=schedule, stages_per_rank=v, checkpoint=checkpoint, autocast=autocast,
                           compile=compiled, sequence_parallel=sp, async_tp=sp,
                           send_flops_per_byte=weights[autocast is not None])
            except GraphsplitError as exc:  # a combination the program refuses (plan.py says why)
                left_out[str(exc).split(": ", 1)[-1]] += 1


def microbatch_counts(per_replica: int, pp: int) -> list[int]:
    """The micro-batch counts tried for a replica's batch: every divisor, or for a batch with many (DeepSeek-V3's
    120 sequences per replica has 16) the four smallest that fill the pipeline and the four largest (a
    bubble shrinks with more micro-batches; fewer, larger ones run each op more efficiently)."""
    found = divisors(per_replica)
    filling = [m for m in found if m >= pp]
    if len(filling) <= 2 * MICROBATCH_EACH_END:
        return found
    return [m for m in found if m < pp] + filling[:MICROBATCH_EACH_END] + filling[-MICROBATCH_EACH_END:]


@dataclass
class _Priced:
    """One group of candidates priced: (candidate index, estimate) of those that fit, the one needing
    the least memory of those that do not, and why the rest could not be priced."""

    fitting: list[tuple[int, Estimate]]
    closest: tuple[int, Estimate] | None
    left_out: Counter[str]


def _price(_state: Any, work: tuple[Any, Hardware, int, str, list[tuple[int, Plan]]]) -> _Priced:
    """Price one group: `work` is (the profile holding the group's table, hardware, memory budget,
    optimizer, the group's (candidate index, plan) pairs)."""
    profile, hw, budget, optimizer, group = work
    priced = _Priced([], None, Counter())
    for index, plan in group:
        try:
            stages = plan_stages(profile, plan)
        except GraphsplitError as exc:
            priced.left_out[str(exc)] += 1
            continue
        memory = plan_memory(plan, stages, optimizer)
        if memory.total > budget and priced.closest is not None and memory.total >= priced.closest[1].memory["total"]:
            continue  # priced: it does not fit, and another needs less; its step time would never be shown
        est = estimate(plan, stages, hw, profile.batch, profile.tokens_per_sample, profile.model_flops_per_sample,
                       optimizer, memory)
        if est.memory["total"] <= budget:
            priced.fitting.append((index, est))
        else:
            priced.closest = (index, est)
    return priced


def search(profile: Any, gpus: int, gpu_memory: int, hw: Hardware, gpus_per_node: int | None = None,
           optimizer: str = "adamw", top: int = 10, workers: Workers | None = None,
           building: dict[tuple[int, bool], Future[Any]] | None = None,
           keep: Callable[[Plan], bool] | None = None) -> SearchResult:
    """Price every candidate for `gpus` devices of `gpu_memory` bytes; the ones that fit, fastest first.

    Candidates are priced in groups that share a table (one tp degree and precision), each group on a
    core of its own where the machine has several (parallel.py), sent with its table alone.
    `building`: tp degree -> its tables still being built on `workers` (plan_model); a degree's groups
    are priced as soon as its tables are there. `keep`: which candidates to price (every one by default)."""
    start = time.perf_counter()
    per_node = gpus_per_node or hw.gpus_per_node
    building = dict(building or {})
    left_out: Counter[str] = Counter()
    groups: dict[tuple[int, bool, bool], list[tuple[int, Plan]]] = {}  # (tp, sequence parallel, low precision)
    send = functools.partial(send_flops_per_byte, hw)
    plans = list(candidates(gpus, per_node, profile.batch, profile.max_stages, profile.has_blocks, left_out,
                            profile.experts, profile.sequence, profile.has_cores, send))
    plans = [p for p in plans if keep is None or keep(p)]
    if "bfloat16" in hw.peak_flops:  # fp16 prices as bf16 does and needs a loss scaler: only bf16 is shown
        plans = [p for p in plans if p.autocast != "fp16"]
    for index, plan in enumerate(plans):
        groups.setdefault((plan.tp, plan.sequence_parallel, plan.autocast is not None), []).append((index, plan))
    missing = sorted({(tp, sp) for tp, sp, low in groups
                      if (tp, sp) not in building and (tp, low, sp) not in profile.variants})
    if missing:  # tables no plan has needed yet, built here first
        profile.add(build_all_tables(profile.source, missing))
    budget = int(gpu_memory * USABLE_FRACTION)
    fitting: list[tuple[int, Estimate]] = []
    closest: tuple[int, Estimate] | None = None
    with contextlib.ExitStack() as stack:
        if workers is None:
            workers = stack.enter_context(Workers(None, len(groups)))

        def price(degree: tuple[int, bool]) -> list[Future[_Priced]]:
            return [workers.submit(_price, (profile.only(t, low, sp), hw, budget, optimizer, group))
                    for (t, sp, low), group in groups.items() if (t, sp) == degree]

        pricing = [f for d in sorted({(t, sp) for t, sp, _ in groups} - set(building)) for f in price(d)]
        by_future = {f: d for d, f in building.items()}
        for done in as_completed(by_future):
            degree = by_future[done]
            profile.add({degree: done.result()})
            pricing += price(degree) if any((t, sp) == degree for t, sp, _ in groups) else []
        for future in pricing:
            priced = future.result()
            fitting += priced.fitting
            left_out.update(priced.left_out)
            if priced.closest is not None and (closest is None or (priced.closest[1].memory["total"], priced.closest[0])
                                               < (closest[1].memory["total"], closest[0])):
                closest = priced.closest
    # candidate order breaks ties, so the answer does not depend on which core priced what
    fitting.sort(key=lambda p: (p[1].step_seconds, p[1].memory["total"], p[1].plan.autocast == "fp16", p[0]))
    found = [est for _, est in fitting]
    result = SearchResult(bool(found), found, None if found or closest is None else closest[1], None, None,
                          len(plans), left_out)
    if not found and closest is not None:
        parts = {k: v for k, v in closest[1].memory.items() if k != "total"}
        result.too_large = max(parts, key=parts.__getitem__)
        result.devices_needed = _devices_needed(profile, gpus, gpu_memory, hw, per_node, optimizer)
    if not profile.sequence and (profile.tokens_per_sample or 0) >= LONG_SEQUENCE:
        result.no_cp = profile.no_sequence
    result.search_seconds = time.perf_counter() - start
    return result


def _devices_needed(profile: Any, gpus: int, gpu_memory: int, hw: Hardware, per_node: int, optimizer: str) -> int | None:
    """The fewest devices (doubling from `gpus`) on which some plan fits, by memory alone."""
    n = gpus * 2
    budget = gpu_memory * USABLE_FRACTION
    while n <= 2**20:
        for plan in candidates(n, per_node, profile.batch, profile.max_stages, profile.has_blocks, Counter(),
                               profile.experts, profile.sequence, send=functools.partial(send_flops_per_byte, hw)):
            if plan.autocast == "fp16" or (plan.dp > 1 and not plan.fsdp and plan.ep == 1) \
                    or plan.checkpoint not in ("blocks", "none") \
                    or plan.compile:
                continue  # the leanest variants decide whether anything fits
            try:
                stages = plan_stages(profile, plan)
            except GraphsplitError:
                continue
            est = estimate(plan, stages, hw, profile.batch, profile.tokens_per_sample,
                           profile.model_flops_per_sample, optimizer)
            if est.memory["total"] <= budget:
                return n
        n *= 2
    return None
