"""The planner: which plan to run, for this model, on this hardware.

    profile_model (profile.py)  trace once, fold repeated blocks (fold.py), an OpTable per tp degree and
                                precision from one compile each, measured over the whole op sequence (measure.py)
    search        (search.py)   every candidate plan, priced from the tables (stages.py, estimate.py)
    hardware      (hardware.py) device and link profiles, each number with its source
    schedules     (schedules.py) activations in flight and bubbles of torch's pipeline schedules

`plan_model` runs the whole thing; `graphsplit plan` prints it, `graphsplit advise`
takes its recommendation from it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from ..loader import LoadedModel
from ..plan import Plan, divisors
from .estimate import Estimate
from .hardware import Hardware, load_hardware
from .parallel import Workers
from .profile import ModelProfile, profile_model, start_profile, tables_or_reason
from .search import SearchResult, search

__all__ = ["Hardware", "ModelProfile", "SearchResult", "load_hardware", "plan_model", "profile_model"]


def plan_model(loaded: LoadedModel, gpus: int, gpu_memory: int, hardware: Hardware, gpus_per_node: int | None = None,
               optimizer: str = "adamw", replica_batch: bool = False, keep: Callable[[Plan], bool] | None = None
               ) -> tuple[SearchResult, ModelProfile]:
    """Profile `loaded` once and search every plan for `gpus` devices of `gpu_memory` bytes each;
    `search_seconds` counts both. `replica_batch`: `loaded`'s batch is what each dp replica trains on
    (a Lightning DataLoader's, as under DDP), not the global batch: see `_search_replica_batch`.
    `keep`: which candidates to price (every one by default). The tp degrees' tables are built on the machine's cores, tp 1's
    first (it says where the model can be cut, so which plans are candidates), then the largest
    degrees (they cost the most); each degree's plans are priced as soon as its tables are built."""
    start = time.perf_counter()
    per_node = gpus_per_node or hardware.gpus_per_node
    profile = start_profile(loaded, hardware.fused_attention)
    profile.hardware = hardware
    # (tp, sequence parallel) degrees: tp 1 first, then the largest (they cost the most)
    degrees = [(1, False), *((tp, sp) for tp in sorted(set(divisors(min(gpus, per_node))) - {1}, reverse=True)
                             for sp in (False, True))]
    with Workers(profile.source, len(degrees)) as workers:
        building = {d: workers.submit(tables_or_reason, d) for d in degrees}
        profile.add({(1, False): building.pop((1, False)).result()})  # plans with a tp that failed are left out
        profile.read_reference()
        if replica_batch:
            result = _search_replica_batch(profile, gpus, gpu_memory, hardware, per_node, optimizer, workers, building,
                                           keep)
        else:
            result = search(profile, gpus, gpu_memory, hardware, per_node, optimizer, workers=workers, building=building,
                            keep=keep)
    result.search_seconds = time.perf_counter() - start
    return result, profile


def _search_replica_batch(profile: ModelProfile, gpus: int, gpu_memory: int, hardware: Hardware, per_node: int,
                          optimizer: str, workers: Workers, building: dict,
                          keep: Callable[[Plan], bool] | None) -> SearchResult:
    """The search where each dp replica trains on the profiled batch: a plan with r replicas trains
    r of them a step, so plans are searched per replica count (the global batch r times the profiled
    one) and ranked by samples per second, not by step time. Context parallelism is left out (its
    ranks share a replica's samples, which a per-replica data loader does not give them)."""
    found: list[Estimate] = []
    closest: list[SearchResult] = []
    considered = 0
    left_out: Counter[str] = Counter()
    for replicas in divisors(gpus):
        result = search(profile.for_batch(profile.batch * replicas), gpus, gpu_memory, hardware, per_node, optimizer,
                        workers=workers, building=building, keep=lambda p, r=replicas: p.dp == r and p.cp == 1 and (keep is None or keep(p)))
        building = {}  # the first search took every table still being built
        found += result.plans
        considered += result.considered
        left_out.update(result.left_out)
        if not result.fits and result.closest is not None:
            closest.append(result)
    found.sort(key=lambda e: (-e.samples_per_second, e.memory["total"]))
    if found or not closest:
        return SearchResult(bool(found), found, None, None, None, considered, left_out)
    least = min(closest, key=lambda r: r.closest.memory["total"])
    return SearchResult(False, [], least.closest, least.too_large, least.devices_needed, considered, left_out)
