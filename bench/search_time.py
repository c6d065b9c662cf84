"""How long the planner's whole Llama 3 405B search takes, next to torch.distributed.pipelining's split of
an 80-layer Llama on the same machine, in the same run.

    python bench/search_time.py              # both, best of 2 each, side by side
    python bench/search_time.py --repeat 3

- search: `graphsplit plan bench/models/llama3_405b.py --gpus 16384 --gpu-memory 80GiB` as a fresh process
  (README's example: every axis on: tp, pp, dp, DDP/FSDP/ZeRO, cp, micro-batches, schedules, checkpointing,
  precision, compile), wall clock from start to exit, imports included; and the search's own clock
  ("searched in": tracing, profiling the tp degrees and pricing every plan).
- reference: `pipeline(model, mb_args=..., split_spec=...)` cutting the 80-layer, 69B-parameter Llama of
  bench/transform_time.py into 8 stages, as that bench times it (model built on meta beforehand, not
  timed; one-off costs paid first on a 2-layer model).

The runs alternate (search, split, search, split, ...), so a machine shared with other work slows both
alike; the best of each is reported.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.distributed.pipelining import SplitPoint, pipeline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.transform_time import LLAMA_2_70B, MODEL_FILE, split_layers  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402

COMMAND = [sys.executable, "-m", "graphsplit", "plan", str(ROOT / "bench" / "models" / "llama3_405b.py"),
           "--gpus", "16384", "--gpu-memory", "80GiB"]
# pipeline() deep-copies an export codegen holding a pytree LeafSpec, which warns on every call.
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
)


def search_once() -> tuple[float, float, str]:
    """(wall seconds of the command, its own "searched in" seconds, its counts line)."""
    start = time.perf_counter()
    done = subprocess.run(COMMAND, capture_output=True, text=True, cwd=ROOT, check=True,
                          env=dict(os.environ, COLUMNS="200", PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - start
    counts = next(line for line in done.stdout.splitlines() if "plans priced" in line)
    searched = re.search(r"searched in ([\d.]+) s", counts)
    return wall, float(searched.group(1)) if searched else float("nan"), counts.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, help="runs of each; the best is reported (default 2)")
    args = p.parse_args()
    loaded = load_model(str(MODEL_FILE))
    config = dict(LLAMA_2_70B, n_layers=80)
    micro = torch.randint(0, config["vocab_size"], (1, 1024), device="meta")
    cuts = split_layers(80, 8)
    with torch.device("meta"):  # one-off costs (export's caches) paid on a tiny model first, as transform_time does
        tiny = loaded.builder(n_layers=2)
    tiny_ids = torch.randint(0, 256, (1, 32), device="meta")
    pipeline(tiny, mb_args=(tiny_ids,), split_spec={"layers.1": SplitPoint.BEGINNING})

    searches, splits = [], []
    for _ in range(args.repeat):
        searches.append(search_once())
        with torch.device("meta"):
            model = loaded.builder(**config)
        start = time.perf_counter()
        pipeline(model, mb_args=(micro,), split_spec={name: SplitPoint.BEGINNING for name in cuts})
        splits.append(time.perf_counter() - start)
        del model
    wall, searched, counts = min(searches)
    split = min(splits)
    print(f"$ graphsplit plan bench/models/llama3_405b.py --gpus 16384 --gpu-memory 80GiB\n  {counts}")
    print(f"\n{'':52}{'seconds':>9}{'/ split':>9}")
    print(f"{'graphsplit plan, whole command (imports included)':52}{wall:9.2f}{wall / split:8.2f}x")
    print(f"{'graphsplit plan, its search (trace, profile, price)':52}{searched:9.2f}{searched / split:8.2f}x")
    print(f"{'torch pipelining pipeline(), 80-layer Llama, pp 8':52}{split:9.2f}{1:8.2f}x")
    print(f"(best of {args.repeat} each, alternating; {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
