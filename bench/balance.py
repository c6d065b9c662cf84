"""Stage balance: graphsplit's cost-model split against an equal-parameter-count split.

    python bench/balance.py                 # gpt, unet, resnet at pp 2/4/8
    python bench/balance.py --models gpt --pp 4 --no-measure

For each model and pp, both splits cut the same traced graph (the parameter
split puts a cut where the running parameter count passes k/pp of the total,
the way GPipe-style tools balance). Each is scored two ways:

- model: max stage cost / mean stage cost under graphsplit's cost model;
- measured: max / mean of each stage's measured forward + backward time for
  one micro-batch on this CPU (median of --repeat runs), real weights.

1.00 is perfectly even. The ratio column is param-split / graphsplit: above 1
means graphsplit's split is more even.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphsplit.ir.meta import info  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.passes.pipeline_split import liveness  # noqa: E402
from graphsplit.plan import Plan  # noqa: E402
from graphsplit.rewrite import rewrite_loaded  # noqa: E402
from graphsplit.runtime.materialize import materialize_stage, model_tensors  # noqa: E402
from graphsplit.runtime.microbatch import split_microbatches  # noqa: E402

# gpt at GPT-2 small's shape (12 layers, 768 wide) so stages hold whole blocks;
# the other examples at their file defaults.
MODELS = {
    "gpt": ("examples/gpt.py", {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 8192, "block_size": 128}),
    "unet": ("examples/unet.py", {}),
    "resnet": ("examples/resnet.py", {}),
}


def param_split_cuts(program_gm, stages: int) -> tuple[str, ...]:
    """Node names starting each stage when stages hold equal parameter bytes."""
    seq, _, blocked = liveness(program_gm)
    weights = []
    for node in seq:
        w = info(node).param_bytes
        w += sum(info(a).param_bytes for a in node.all_input_nodes if a.op == "get_attr" and a.users and next(iter(a.users)) is node)
        weights.append(w)
    total = sum(weights)
    cuts, running, k = [], 0.0, 1
    for i, w in enumerate(weights):
        while k < stages and running >= k * total / stages and i > (cuts[-1] if cuts else 0):
            j = i
            while j < len(seq) - 1 and blocked[j]:
                j += 1
            cuts.append(j)
            k += 1
        running += w
    while len(cuts) < stages - 1:  # a heavy tail: spread the rest over the last nodes
        cuts.append(min(len(seq) - 1, (cuts[-1] if cuts else 0) + 1))
    cuts = sorted(set(cuts))
    return tuple(seq[c].name for c in cuts)


def measure(program, loaded, model, repeat: int) -> list[float]:
    """Forward + backward seconds of each stage for one micro-batch (median of `repeat`)."""
    source = model_tensors(model)
    modules = [materialize_stage(s, "cpu", source) for s in program.stages]
    flat = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    values = split_microbatches(flat, program.plan.num_microbatches)[0]
    times = []
    for module in modules:
        inputs = tuple(v.detach().requires_grad_(v.is_floating_point()) for v in values)
        samples = []
        for _ in range(repeat + 1):
            start = time.perf_counter()
            out = module(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            grads = [torch.ones_like(o) for o in outs if o.requires_grad]
            torch.autograd.backward([o for o in outs if o.requires_grad], grads)
            samples.append(time.perf_counter() - start)
        times.append(statistics.median(samples[1:]))
        values = tuple(o.detach() for o in outs)
    return times


def spread(xs: list[float]) -> float:
    return max(xs) / (sum(xs) / len(xs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,unet,resnet")
    parser.add_argument("--pp", default="2,4,8")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-measure", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per stage, as a pipeline rank has its own device
    print(f"{'model':8} {'pp':>3} | {'graphsplit':>10} {'param-split':>11} {'ratio':>6} | "
          f"{'graphsplit':>10} {'param-split':>11} {'ratio':>6}")
    print(f"{'':8} {'':>3} | {'model cost max/mean':^30} | {'measured fwd+bwd max/mean':^30}")
    for name in args.models.split(","):
        path, overrides = MODELS[name]
        loaded = load_model(str(ROOT / path))
        builder = loaded.builder
        loaded.builder = lambda b=builder, o=overrides: b(**o)
        if name == "gpt":
            g = torch.Generator().manual_seed(0)
            idx = torch.randint(0, overrides["vocab_size"], (8, overrides["block_size"]), generator=g)
            loaded.args, loaded.target = (idx,), idx.clone()
        model = loaded.build("cpu", seed=0) if not args.no_measure else None
        for pp in [int(p) for p in args.pp.split(",")]:
            batch = next(t.shape[0] for t in (*loaded.args, *loaded.kwargs.values()) if isinstance(t, torch.Tensor))
            plan = Plan(pp=pp, microbatches=math.gcd(batch, pp))
            ours = rewrite_loaded(loaded, plan).program
            cuts = param_split_cuts(ours.traced.gm, pp)
            theirs = rewrite_loaded(loaded, plan, cuts).program
            a, b = ours.balance(), theirs.balance()
            row = f"{name:8} {pp:>3} | {a:>10.3f} {b:>11.3f} {b / a:>6.2f} |"
            if model is not None:
                ma, mb = spread(measure(ours, loaded, model, args.repeat)), spread(measure(theirs, loaded, model, args.repeat))
                row += f" {ma:>10.3f} {mb:>11.3f} {mb / ma:>6.2f}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
