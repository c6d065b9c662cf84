"""How long graphsplit's transform takes on a 65B-class Llama model, next to
`torch.distributed.pipelining.pipeline()` splitting the same model into as many stages.

    python bench/transform_time.py                # 80 layers, 69B parameters, pp=8
    python bench/transform_time.py --layers 8     # a quick run
    python bench/transform_time.py --profile 25   # also cProfile one graphsplit transform

Both sides start from a model already built on `meta` (building is not timed;
each measurement gets a freshly built model, because `pipeline()` patches the
`forward` of the modules named in its split spec). Timed:

- graphsplit: `graphsplit.transform(...)` with `out_dir`: trace, meta shape/FLOP
  analysis, the passes, per-stage GraphModules, plan.json and the stage files.
  Once with the same fixed cuts as the reference (`Plan.split_at`), once with
  graphsplit choosing the cuts itself.
- reference: `pipeline(model, mb_args=(one micro-batch,), split_spec=...)`, cut
  before `layers.{k * L / pp}` for k = 1..pp-1: torch.export, then split_module
  and moving parameters into the stage submodules.

The best of `--repeat` runs is reported for each.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import pstats
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.pipelining import SplitPoint, pipeline

from graphsplit import Plan, transform
from graphsplit.loader import load_model

MODEL_FILE = Path(__file__).resolve().parents[1] / "examples" / "llama.py"
# 80 layers of these make Llama-2-70B's shape: 69.0B parameters with the untied head.
LLAMA_2_70B = dict(
    dim=8192, n_heads=64, n_kv_heads=8, hidden=28672, vocab_size=32000, max_seq_len=4096
)


# pipeline() deep-copies an export codegen holding a pytree LeafSpec, which warns on every call.
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=80, help="decoder layers (default 80)")
    p.add_argument("--pp", type=int, default=8, help="pipeline stages (default 8)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each; the best is reported")
    p.add_argument(
        "--batch", type=int, default=8, help="batch size; one micro-batch per stage (default 8)"
    )
    p.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile one graphsplit transform (fixed cuts) and print its top N functions",
    )
    return p.parse_args()


def split_layers(layers: int, pp: int) -> list[str]:
    """Module names that start stages 1..pp-1: the decoder layers cut evenly."""
    return [f"layers.{k * layers // pp}" for k in range(1, pp)]


def best_of(
    repeat: int, build: Callable[[], torch.nn.Module], run: Callable[[torch.nn.Module], None]
) -> float:
    times = []
    for _ in range(repeat):
        model = build()
        gc.collect()
        start = time.perf_counter()
        run(model)
        times.append(time.perf_counter() - start)
        del model
    return min(times)


def main() -> None:
    args = parse_args()
    loaded = load_model(str(MODEL_FILE))
    build_model = loaded.builder
    config = dict(LLAMA_2_70B, n_layers=args.layers)
    ids = torch.randint(0, config["vocab_size"], (args.batch, args.seq), device="meta")
    micro = ids[: args.batch // args.pp]
    cuts = split_layers(args.layers, args.pp)

    def build() -> torch.nn.Module:
        with torch.device("meta"):
            return build_model(**config)

    # plan label -> graphsplit's own phase timings, last run
    phases: dict[str, dict[str, float]] = {}

    def graphsplit_run(label: str, plan: Plan) -> Callable[[torch.nn.Module], None]:
        def run(model: torch.nn.Module) -> None:
            # The LoadedModel hands graphsplit the model already built (its builder is
            # called inside transform(), outside the transform's own clock).
            ready = dataclasses.replace(loaded, builder=lambda: model, args=(ids,), kwargs={})
            with tempfile.TemporaryDirectory() as out:
                summary = transform(ready, plan, out_dir=out).summary
            timings = dict(summary["timings"])
            timings["summary + artifacts"] = summary["transform_seconds"] - sum(timings.values())
            phases[label] = timings

        return run

    def reference_run(model: torch.nn.Module) -> None:
        pipe = pipeline(
            model, mb_args=(micro,), split_spec={name: SplitPoint.BEGINNING for name in cuts}
        )
        assert pipe.num_stages == args.pp, pipe.num_stages

    n_params = sum(p.numel() for p in build().parameters())
    print(
        f"Llama: {args.layers} layers, dim {config['dim']}, {n_params / 1e9:.2f}B parameters on meta; "
        f"input ids {tuple(ids.shape)}, {args.pp} stages cut before {', '.join(cuts)}"
    )

    fixed = Plan(pp=args.pp, split_at=tuple(cuts))
    # First calls pay one-off costs (imports, dispatcher and export caches): pay them on a
    # tiny model so neither side's timing includes them.
    with torch.device("meta"):
        tiny = build_model(n_layers=2)
    tiny_ids = torch.randint(0, 256, (2, 32), device="meta")
    transform(
        dataclasses.replace(loaded, builder=lambda: tiny, args=(tiny_ids,), kwargs={}), Plan(pp=2)
    )
    pipeline(tiny, mb_args=(tiny_ids[:1],), split_spec={"layers.1": SplitPoint.BEGINNING})

    t_fixed = best_of(args.repeat, build, graphsplit_run("same cuts", fixed))
    t_auto = best_of(args.repeat, build, graphsplit_run("auto cuts", Plan(pp=args.pp)))
    t_ref = best_of(args.repeat, build, reference_run)

    rows = [
        ("graphsplit transform, same cuts", t_fixed),
        ("graphsplit transform, auto cuts", t_auto),
        ("torch pipelining pipeline()", t_ref),
    ]
    print(f"\n{'':34}{'seconds':>9}{'ref / this':>12}")
    for name, t in rows:
        print(f"{name:34}{t:9.2f}{t_ref / t:11.1f}x")
    print(f"(best of {args.repeat}; parameters {n_params:,})")
    print("\ngraphsplit's phases (its own clock, last run), seconds:")
    for label, timings in phases.items():
        print(f"  {label:10} " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))

    if args.profile:
        model = build()
        profiler = cProfile.Profile()
        profiler.enable()
        graphsplit_run("profiled", fixed)(model)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.profile)
        print(text.getvalue())


if __name__ == "__main__":
    main()
