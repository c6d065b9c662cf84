"""Measure this machine as a hardware profile: `python -m graphsplit.planner.calibrate [--out cpu.json]`.

What `graphsplit run` gives each rank on a CPU: one thread (OMP_NUM_THREADS=1) and
gloo over loopback. Measured: matmul FLOP/s in fp32 and bf16 (the largest of a few
square sizes, the best of a few repeats), the bandwidth of a large elementwise op,
and gloo's all-reduce between two processes (bandwidth from a large message,
latency from a small one). Efficiencies are 1: the measured rates are what the
model may expect. Written with its sources (this command, the date, the CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch


def _best(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(dtype: torch.dtype) -> float:
    rates = []
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        rates.append(2 * n**3 / _best(lambda a=a, b=b: a @ b, 3))
    return max(rates)


def op_overhead() -> float:
    """Seconds one tiny op costs while autograd records it: eager dispatch, which a small model's step is
    mostly made of."""
    x = torch.ones(4, requires_grad=True)

    def ops() -> None:
        for _ in range(200):
            torch.add(x, x)

    return _best(ops, 5) / 200


def memory_bandwidth() -> float:
    x = torch.randn(32 * 2**20 // 4)
    out = torch.empty_like(x)
    return 2 * x.numel() * 4 / _best(lambda: torch.add(x, x, out=out))  # x read once (cached twice), out written


def _gloo_worker(rank: int, port: int, result: dict) -> None:  # pragma: no cover - in a child process
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    big, small = torch.ones(16 * 2**20 // 4), torch.ones(1)
    t_big = _best(lambda: dist.all_reduce(big), 5)
    t_small = _best(lambda: dist.all_reduce(small), 20)
    if rank == 0:
        # a ring all-reduce of two ranks moves the message once each way
        result["bandwidth"] = big.numel() * 4 / t_big
        result["latency"] = t_small
    dist.destroy_process_group()


def gloo_link() -> tuple[float, float]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    result = manager.dict()
    mp.spawn(_gloo_worker, args=(port, result), nprocs=2, join=True)
    return float(result["bandwidth"]), float(result["latency"])


def calibrate() -> dict:
    torch.set_num_threads(1)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fp32, bf16 = matmul_flops(torch.float32), matmul_flops(torch.bfloat16)
    bandwidth = memory_bandwidth()
    overhead = op_overhead()
    link, latency = gloo_link()
    cores = os.cpu_count() or 1
    where = f"measured by python -m graphsplit.planner.calibrate on {datetime.date.today()} ({cpu}, {cores} cores)"
    return {
        "name": f"CPU ({cpu}), one thread per rank, gloo",
        "memory_bytes": int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        "peak_flops": {"float32": fp32, "bfloat16": bf16, "float16": bf16},
        "memory_bandwidth": bandwidth,
        "gpus_per_node": max(8, cores),
        "intra_node_bandwidth": link,
        "inter_node_bandwidth": link,
        "intra_node_latency": latency,
        "inter_node_latency": latency,
        "matmul_efficiency": 1.0,
        "memory_efficiency": 1.0,
        "link_efficiency": 1.0,
        "op_overhead": overhead,
        "shared_cores": cores,
        "sources": {
            "memory_bytes": "this machine's physical memory (sysconf)",
            "peak_flops": f"{where}: best square matmul (512-2048) in one thread; float16 taken as bfloat16",
            "memory_bandwidth": f"{where}: a 32 MiB elementwise add, bytes read and written per second",
            "gpus_per_node": "one machine: graphsplit run starts every rank on it (8, or its cores if more)",
            "intra_node_bandwidth": f"{where}: gloo all_reduce of 16 MiB between two processes over loopback",
            "inter_node_bandwidth": "the same loopback link: one machine",
            "intra_node_latency": f"{where}: gloo all_reduce of one float",
            "inter_node_latency": "the same loopback link",
            "matmul_efficiency": "1: the measured rates are achieved rates",
            "memory_efficiency": "1: measured",
            "link_efficiency": "1: measured",
            "op_overhead": f"{where}: torch.add of 4 floats recorded by autograd, per call",
            "shared_cores": "ranks beyond this many share the cores (each runs one thread)",
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "hardware" / "cpu.json")
    args = parser.parse_args()
    profile = calibrate()
    args.out.write_text(json.dumps(profile, indent=2) + "\n")
    print(f"wrote {args.out}: fp32 {profile['peak_flops']['float32'] / 1e9:.1f} GFLOP/s, "
          f"bf16 {profile['peak_flops']['bfloat16'] / 1e9:.1f} GFLOP/s, memory {profile['memory_bandwidth'] / 1e9:.2f} GB/s, "
          f"gloo {profile['intra_node_bandwidth'] / 1e9:.2f} GB/s, {profile['intra_node_latency'] * 1e6:.0f} us")


if __name__ == "__main__":
    main()
