"""Per-rank initialization time without weights: the exact mode against fast init, against model size.

    python bench/init_time.py                       # GPT shapes of about 60M, 250M and 1.1B parameters
    python bench/init_time.py --sizes small,medium  # a quick run

For each size a GPT (examples/gpt.py, vocabulary 50304) is planned on meta at tp 1 and at tp 8
(one pipeline stage), and rank 0's stage is materialized on CPU, one thread, both ways:

- exact (runtime/exact_init.py): the constructor with the plan's seed, every random number of
  the whole model drawn, rank 0's parameters kept, then its tp block sliced out;
- fast (runtime/fast_init.py): only rank 0's blocks drawn, tile by tile.

Printed per size and tp share: parameters held by the rank, seconds for each mode, the ratio
fast / exact, and the elements fast init drew (= held, but for tiles a shard edge cuts).
Exact's cost is the whole model's at any tp; fast's follows what the rank holds.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphsplit import Plan  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.rewrite import rewrite_loaded  # noqa: E402
from graphsplit.runtime.exact_init import exact_build  # noqa: E402
from graphsplit.runtime.fast_init import FastInit  # noqa: E402
from graphsplit.runtime.materialize import materialize_stages  # noqa: E402

SIZES = {"small": (8, 512, 8), "medium": (16, 1024, 16), "large": (20, 2048, 16)}  # layers, dim, heads
MODEL = '''
import sys
sys.path.insert(0, {examples!r})
import torch
from gpt import build_model as _gpt

def build_model():
    return _gpt(n_layer={layers}, n_embd={dim}, n_head={heads}, block_size=64, vocab_size=50304)

def example_inputs():
    return (torch.zeros(8, 64, dtype=torch.long),)
'''


def _timed(fn):  # noqa: ANN001, ANN202
    gc.collect()
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--tp", default="1,8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':>8} {'tp':>3} {'held by rank 0':>15} {'exact s':>8} {'fast s':>8} {'fast/exact':>10} {'drawn':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            layers, dim, heads = SIZES[size]
            path = Path(tmp) / f"gpt_{size}.py"
            path.write_text(MODEL.format(examples=str(ROOT / "examples"), layers=layers, dim=dim, heads=heads))
            loaded = load_model(str(path))
            total = sum(p.numel() for p in loaded.build("meta").parameters())
            for tp in map(int, args.tp.split(",")):
                program = rewrite_loaded(loaded, Plan(tp=tp)).program
                keep = set(program.stages[0].param_sources.values())

                def exact(program=program, keep=keep, loaded=loaded):  # noqa: ANN001, ANN202
                    return materialize_stages(program, [0], "cpu", exact_build(loaded, 0, keep), 0)

                def fast(program=program, loaded=loaded):  # noqa: ANN001, ANN202
                    source = FastInit.for_model(loaded, 0)  # rules, and buffers from the constructor on meta
                    return materialize_stages(program, [0], "cpu", source, 0), source.drawn

                (held_modules, drawn), fast_s = _timed(fast)
                held = sum(p.numel() for p in held_modules[0].parameters())
                del held_modules
                _, exact_s = _timed(exact)
                print(f"{f'{total / 1e6:.0f}M':>8} {tp:>3} {held:>15,} {exact_s:>8.2f} {fast_s:>8.2f} "
                      f"{fast_s / exact_s:>10.3f} {drawn:>14,}", flush=True)


if __name__ == "__main__":
    main()
