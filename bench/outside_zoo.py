"""Models written by others, unchanged (tests/models/outside/SOURCES.md), at pp 2, tp 2 and dp 2 x pp 2.

    python bench/outside_zoo.py                    # every model (~2 min)
    python bench/outside_zoo.py --only nanogpt     # some

Each cell is the local backend's check (every stage, tp shard and dp replica in one process against
the untouched model: loss, output, every rank's gradient slice, fp32, 1e-5 scaled by magnitude or the
reference's own noise x10 where that is larger): "passes" with the largest scaled difference,
"refused" with graphsplit's one line, or "FAILS" with the first mismatch or error
(tests/test_outside_zoo.py also runs each at pp 2 on real processes). Prints markdown for docs/models.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from zoo_table import cell, left_whole  # noqa: E402

from graphsplit.errors import GraphsplitError  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.plan import Plan  # noqa: E402
from graphsplit.rewrite import trace_loaded  # noqa: E402

OUTSIDE = ROOT / "tests" / "models" / "outside"
PLANS = {"pp 2": Plan(pp=2), "tp 2": Plan(tp=2), "dp 2 x pp 2": Plan(dp=2, pp=2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model names, e.g. nanogpt mamba (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    files = sorted(OUTSIDE.glob("*_tiny.py"))
    if args.only:
        files = [f for f in files if f.name.removesuffix("_tiny.py") in args.only]
    print("| model | tracer | " + " | ".join(PLANS) + " | left whole under tp 2 (correct, not sharded) |")
    print("|---" * (3 + len(PLANS)) + "|")
    start = time.perf_counter()
    for path in files:
        name = path.name.removesuffix("_tiny.py")
        try:
            loaded = load_model(str(path))
            traced = trace_loaded(loaded)
        except GraphsplitError as exc:
            print(f"| {name} | - | " + " | ".join([f"refused: {exc}"] * len(PLANS)) + " | |", flush=True)
            continue
        results = {label: cell(loaded, plan, traced.copy()) for label, plan in PLANS.items()}
        tp_program = results["tp 2"][1]
        whole = (left_whole(tp_program) or "nothing") if tp_program is not None else ""
        print(f"| {name} | {traced.tracer} | " + " | ".join(text for text, _ in results.values()) + f" | {whole} |",
              flush=True)
    print(f"\n{len(files)} models; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
