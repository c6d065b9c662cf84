"""--compile's step time on CPU: a small GPT's pipeline stages eager against the same stages under
torch.compile (inductor), in one process, in one run.

    python bench/compile_step.py                       # GPT example, 4 layers, dim 128, batch 8 x 64 tokens
    python bench/compile_step.py --layers 2 --rounds 3 # a quick run
    python bench/compile_step.py --backend aot_eager   # dynamo + AOT autograd, no code generation

Both sides are graphsplit's local backend running Plan(pp=2) on the same weights and batch:
`Plan(pp=2)` and `Plan(pp=2, compile=True)` (each stage `nn.Module.compile`d). A step is
forward + backward over the micro-batches. Compilation happens in the warm-up steps and is
printed on its own; then the two are timed in interleaved rounds (the order alternating), so
machine noise falls on both alike. Printed: the median per-step wall time of each, the ratio
compiled / eager (below 1: compile is faster), step 1's loss from both (they must agree).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphsplit import Plan  # noqa: E402
from graphsplit.backends.local import LocalProgram  # noqa: E402
from graphsplit.launch.parity import default_target  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.rewrite import rewrite_loaded  # noqa: E402
from graphsplit.runtime.materialize import model_tensors  # noqa: E402

MODEL = '''
import sys
sys.path.insert(0, {examples!r})
import torch
from gpt import build_model as _gpt, loss_fn  # noqa: F401

def build_model():
    return _gpt(n_layer={layers}, n_embd={dim}, n_head=4, block_size={seq}, vocab_size=512)

def example_inputs():
    return (torch.randint(0, 512, ({batch}, {seq}), generator=torch.Generator().manual_seed(0)),)

def example_target():
    return torch.randint(0, 512, ({batch}, {seq}), generator=torch.Generator().manual_seed(1))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench_gpt.py"
        path.write_text(MODEL.format(examples=str(ROOT / "examples"), layers=args.layers, dim=args.dim,
                                     seq=args.seq, batch=args.batch))
        loaded = load_model(str(path))
        weights = model_tensors(loaded.build("cpu", seed=0))
        inputs = loaded.args
        target = loaded.target if loaded.target is not None else default_target(inputs)
        sides = {}
        for name, plan in (("eager", Plan(pp=2)), ("compiled", Plan(pp=2, compile=True))):
            program = rewrite_loaded(loaded, plan).program
            sides[name] = LocalProgram(program, weights, loaded.loss_fn, args.backend)

        def step(name: str) -> float:
            (result,) = sides[name].step(inputs, target)
            for pipe in sides[name].ranks:
                for stage in pipe.stages:
                    stage.zero_grad(set_to_none=True)
            return float(result.loss)

        first = {}
        for name in sides:
            started = time.perf_counter()
            first[name] = step(name)
            for _ in range(2):
                step(name)
            print(f"{name:9} warm-up (3 steps{', compilation included' if name == 'compiled' else ''}): "
                  f"{time.perf_counter() - started:.1f} s")
        times: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                started = time.perf_counter()
                for _ in range(args.steps):
                    step(name)
                times[name].append((time.perf_counter() - started) / args.steps)
        eager, compiled = (statistics.median(times[n]) for n in ("eager", "compiled"))
        print(f"GPT {args.layers} layers, dim {args.dim}, batch {args.batch} x {args.seq} tokens, pp 2 (local backend), "
              f"1 thread, backend {args.backend}")
        print(f"  step 1 loss   eager {first['eager']:.6f}  compiled {first['compiled']:.6f}")
        print(f"  step time     eager {eager * 1e3:.1f} ms  compiled {compiled * 1e3:.1f} ms  "
              f"(median of {args.rounds} rounds x {args.steps} steps)")
        print(f"  ratio compiled / eager: {compiled / eager:.2f}")


if __name__ == "__main__":
    main()
