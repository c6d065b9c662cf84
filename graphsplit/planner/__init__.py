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

from ..loader import LoadedModel
from ..plan import divisors
from .hardware import Hardware, load_hardware
from .profile import ModelProfile, profile_model
from .search import SearchResult, search

__all__ = ["Hardware", "ModelProfile", "SearchResult", "load_hardware", "plan_model", "profile_model"]


def plan_model(loaded: LoadedModel, gpus: int, gpu_memory: int, hardware: Hardware, gpus_per_node: int | None = None,
               optimizer: str = "adamw") -> tuple[SearchResult, ModelProfile]:
    """Profile `loaded` once and search every plan for `gpus` devices of `gpu_memory` bytes each;
    `search_seconds` counts both."""
    start = time.perf_counter()
    per_node = gpus_per_node or hardware.gpus_per_node
    profile = profile_model(loaded, divisors(min(gpus, per_node)), hardware.fused_attention)
    profile.hardware = hardware
    result = search(profile, gpus, gpu_memory, hardware, per_node, optimizer)
    result.search_seconds = time.perf_counter() - start
    return result, profile
