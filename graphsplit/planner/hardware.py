"""Hardware profiles: what the time and memory models price a plan against.

Profiles ship as JSON files beside this module (h100, h200, a100, cpu); every
number carries its source under "sources" (a datasheet, a paper, a measurement
on this machine, or "assumed: ..." with the reason). A user's own file, with the
same keys, is read by path: `graphsplit plan MODEL --hardware my_cluster.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GraphsplitError

HERE = Path(__file__).parent / "hardware"
BUILTIN = ("h100", "h200", "a100", "cpu")
_REQUIRED = ("name", "memory_bytes", "peak_flops", "memory_bandwidth", "gpus_per_node", "intra_node_bandwidth",
             "inter_node_bandwidth", "intra_node_latency", "inter_node_latency", "matmul_efficiency",
             "memory_efficiency", "link_efficiency")


@dataclass(frozen=True)
class Hardware:
    """One device kind and the links between devices, in bytes, seconds and FLOP/s."""

    name: str
    memory_bytes: int
    peak_flops: dict[str, float]  # per compute dtype: "float32", "bfloat16", "float16"
    memory_bandwidth: float  # bytes/s
    gpus_per_node: int
    intra_node_bandwidth: float  # bytes/s each way per device (NVLink; loopback for cpu)
    inter_node_bandwidth: float  # bytes/s each way per device (the network)
    intra_node_latency: float  # seconds per collective step
    inter_node_latency: float
    matmul_efficiency: float  # fraction of peak FLOP/s large matmuls reach
    memory_efficiency: float  # fraction of memory bandwidth memory-bound ops reach
    link_efficiency: float  # fraction of link bandwidth collectives reach
    # seconds every op costs beyond its roofline time (eager dispatch, kernel launch)
    op_overhead: float = 0.0
    # attention runs as a fused kernel (flash / memory-efficient: no sequence x sequence matrix kept)
    fused_attention: bool = False
    # measured fractions of peak by matmul shape (planner/gemm_table.py): how shape moves the rate
    matmul_table: dict[str, Any] | None = None
    # the fraction of a ring step's transfer that the matmul running beside it hides (--async-tp): 1 would be
    # perfect overlap; contention (the transfer's kernels take SMs and memory bandwidth from the GEMM, the
    # chunked GEMMs' waves and stream joins) leaves part of it exposed
    overlap_efficiency: float = 1.0
    # processes sharing `shared_cores` cores (a CPU machine running more ranks than cores): 0 = none
    shared_cores: int = 0
    sources: dict[str, str] = field(default_factory=dict)

    def flops(self, dtype: str) -> float:
        """Achievable matmul FLOP/s in `dtype` (float32 when the profile has no number for it)."""
        return self.peak_flops.get(dtype, self.peak_flops["float32"]) * self.matmul_efficiency

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def load_hardware(name_or_path: str) -> Hardware:
    """A built-in profile by name (h100, h200, a100, cpu) or a JSON file with the same keys."""
    path = HERE / f"{name_or_path.lower()}.json" if name_or_path.lower() in BUILTIN else Path(name_or_path)
    if not path.is_file():
        raise GraphsplitError(f"--hardware {name_or_path}: neither a built-in profile ({', '.join(BUILTIN)}) nor a "
                              "JSON file; give one of those or the path of a profile written like "
                              f"{HERE / 'h100.json'}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GraphsplitError(f"cannot read hardware profile {path}: {exc}; write it as JSON like "
                              f"{HERE / 'h100.json'}") from None
    if not isinstance(data, dict):
        raise GraphsplitError(f"hardware profile {path} is not a JSON object; write it like {HERE / 'h100.json'}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise GraphsplitError(f"hardware profile {path} lacks {', '.join(missing)}; every key of "
                              f"{HERE / 'h100.json'} is needed")
    known = {k: data[k] for k in Hardware.__dataclass_fields__ if k in data}
    try:
        hw = Hardware(**known)
        numbers = [hw.memory_bytes, hw.memory_bandwidth, hw.gpus_per_node, hw.intra_node_bandwidth,
                   hw.inter_node_bandwidth, hw.matmul_efficiency, hw.memory_efficiency, hw.link_efficiency,
                   *hw.peak_flops.values()]
        bad = any(float(v) <= 0 for v in numbers) or "float32" not in hw.peak_flops \
            or not 0 <= float(hw.overlap_efficiency) <= 1
    except (TypeError, ValueError, AttributeError):
        bad = True
    if not bad and hw.matmul_table is not None:
        _check_matmul_table(hw.matmul_table, path)
    if bad:
        raise GraphsplitError(f"hardware profile {path}: every number must be positive and peak_flops must hold "
                              "at least float32; see " + str(HERE / "h100.json"))
    return hw


def _check_matmul_table(table: Any, path: Path) -> None:
    """A profile's `matmul_table`: ascending sizes and, per dtype, a cube of positive fractions over them."""
    import numpy as np

    try:
        sizes = [int(x) for x in table["sizes"]]
        grids = [np.asarray(table[d], dtype=np.float64) for d in ("bfloat16", "float8") if d in table]
        ok = (len(sizes) >= 2 and sizes == sorted(set(sizes)) and min(sizes) > 0 and bool(grids)
              and all(g.shape == (len(sizes),) * 3 and (g > 0).all() for g in grids))
    except (TypeError, ValueError, KeyError):
        ok = False
    if not ok:
        raise GraphsplitError(f"hardware profile {path}: matmul_table needs ascending 'sizes' and a 'bfloat16' cube "
                              "of positive fractions of peak over them (bench/gpu_kernels.py --grid writes one)")
