"""Training memory per rank: parameters, gradients, AdamW state and saved activations,
measured, beside the ideal (the whole model's figure divided by the shards).

    python bench/memory.py                  # gpt at GPT-2-small shape, several plans
    python bench/memory.py --layers 4 --dim 256
    python bench/memory.py --sequence-parallel   # activations at tp 2 with and without it

Parameters are materialized for real on CPU, rank by rank (the busiest rank is
shown); gradients are allocated like the parameters and AdamW takes one step so
its state exists, then every tensor is counted. Activations are the bytes kept
for backward by one micro-batch of the busiest stage, measured on meta with
`saved_tensors_hooks` (analysis/memory.py). Ideal: parameters / (tp x pp) for
parameters, gradients and optimizer state. For `blocks` checkpointing the
lower bound is what must stay if every block is recomputed from its inputs:
the bytes of the tensors each stage's repeated blocks (h.N) read from outside
themselves, found on the graph without checkpointing; the ratio is the worst
stage's measured / bound. The loss (outside the stage graphs, run by the
schedule) is not part of these figures.

`--sequence-parallel` prints, at tp 2 and tp 2 x pp 2, the activation bytes one rank keeps for
backward with and without sequence parallelism (measured the same way), their ratio, and the ratio
to the ideal: the same plan without tp, divided by tp.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphsplit.analysis.memory import saved_bytes  # noqa: E402
from graphsplit.ir.meta import block_of, info  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.plan import Plan  # noqa: E402
from graphsplit.rewrite import rewrite_loaded  # noqa: E402
from graphsplit.runtime.materialize import materialize_stage, model_tensors  # noqa: E402

PLANS = [
    Plan(),
    Plan(tp=2),
    Plan(pp=2),
    Plan(tp=2, pp=2),
    Plan(tp=4, pp=2),
    Plan(pp=2, checkpoint="blocks"),
    Plan(tp=2, pp=2, checkpoint="blocks"),
]


def mib(n: float) -> str:
    return f"{n / 2**20:8.1f}"


def rank_state_bytes(program, model, pp_rank: int, tp_rank: int) -> tuple[int, int, int]:
    """(parameters, gradients, AdamW state) bytes one rank holds, counted on real tensors."""
    plan = program.plan
    source = model_tensors(model)
    modules = [materialize_stage(program.stages[s], "cpu", source, 0, program.param_shardings, tp_rank, plan.tp)
               for s in plan.stages_of_rank(pp_rank)]
    params = {id(p): p for m in modules for p in m.parameters()}
    for p in params.values():
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(list(params.values()))
    opt.step()
    n_param = sum(p.numel() * p.element_size() for p in params.values())
    n_state = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                  if isinstance(t, torch.Tensor) and t.dim() > 0)
    return n_param, n_param, n_state


def block_input_bytes(program) -> list[int]:
    """Per stage, bytes of the tensors its blocks read from outside the block (or the stage)."""
    found: list[dict] = [{} for _ in program.stages]
    for n in program.traced.gm.graph.nodes:
        block = block_of(info(n).module) if n.op not in ("placeholder", "get_attr", "output") else None
        if block is None:
            continue
        for a in n.all_input_nodes:
            outside = a.op == "placeholder" or info(a).stage != info(n).stage or block_of(info(a).module) != block
            if outside and a.op != "get_attr" and info(a).tensor is not None:
                found[info(n).stage][a] = info(a).tensor.nbytes
    return [sum(f.values()) for f in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="Only the activations at tp 2 with and without sequence parallelism.")
    args = parser.parse_args()
    loaded = load_model(str(ROOT / "examples" / "gpt.py"))
    cfg = dict(n_layer=args.layers, n_embd=args.dim, n_head=args.heads, vocab_size=args.vocab, block_size=args.seq)
    builder = loaded.builder
    loaded.builder = lambda: builder(**cfg)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, args.vocab, (8, args.seq), generator=g)
    loaded.args, loaded.target = (idx,), idx.clone()
    if args.sequence_parallel:
        sequence_parallel_rows(loaded)
        return
    model = loaded.build("cpu", seed=0)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"gpt: {args.layers} layers, dim {args.dim}, vocab {args.vocab}, {total / 4 / 1e6:.1f}M parameters "
          f"({mib(total).strip()} MiB fp32); MiB per rank (busiest rank), ratio = measured / ideal;\n"
          f"activations: busiest stage; bound: block inputs (largest stage); ratio: worst stage, "
          f"stages: measured/bound per stage")
    print(f"{'plan':28} {'params':>8} {'grads':>8} {'adamw':>8} {'ideal':>8} {'ratio':>6} | "
          f"{'acts/mb':>8} {'no ckpt':>8} {'bound':>8} {'ratio':>6}")
    for plan in PLANS:
        program = rewrite_loaded(loaded, plan).program
        worst = max((rank_state_bytes(program, model, p, t) for p in range(plan.pp) for t in range(plan.tp)),
                    key=lambda x: x[0])
        ideal = total / (plan.tp * plan.pp)
        acts, plain = [], []
        unwrapped = rewrite_loaded(loaded, plan.replace(checkpoint="none")).program
        assert [s.flops for s in unwrapped.stages] == [s.flops for s in program.stages], "the same split"
        bound = block_input_bytes(unwrapped)
        for st in program.stages:
            names = {id(st.gm.get_parameter(k)): c for k, c in st.param_sources.items()}
            inputs = st.input_examples()
            acts.append(saved_bytes(st.gm, inputs, plan.tp, True, program.param_shardings, names))
            plain.append(saved_bytes(st.gm, inputs, plan.tp, False, program.param_shardings, names))
        name = f"tp={plan.tp} pp={plan.pp} ckpt={plan.checkpoint}"
        row = f"{name:28} {mib(worst[0])} {mib(worst[1])} {mib(worst[2])} {mib(ideal)} {worst[0] / ideal:6.2f} | "
        row += f"{mib(max(acts))} {mib(max(plain))}"
        if plan.checkpoint == "blocks":
            ratio = max(a / b for a, b in zip(acts, bound))
            row += f" {mib(max(bound))} {ratio:6.2f}   stages: "
            row += ", ".join(f"{a / 2**20:.2f}/{b / 2**20:.2f}" for a, b in zip(acts, bound))
        else:
            row += f" {'-':>8} {'-':>6}"
        print(row, flush=True)


def stage_activations(program) -> list[int]:
    """Bytes each stage keeps for backward, one micro-batch, on one tp rank."""
    found = []
    for st in program.stages:
        names = {id(st.gm.get_parameter(k)): c for k, c in st.param_sources.items()}
        found.append(saved_bytes(st.gm, st.input_examples(), program.plan.tp, True, program.param_shardings, names))
    return found


def sequence_parallel_rows(loaded) -> None:
    """Activations per rank with and without sequence parallelism, the references (tp alone, and no
    tp divided by tp: the ideal) first."""
    print(f"{'plan':28} {'acts/mb (busiest stage, MiB)':>30} {'ratio sp/tp':>12} {'ratio sp/ideal':>15}")
    for plan in (Plan(tp=2), Plan(tp=2, pp=2)):
        whole = max(stage_activations(rewrite_loaded(loaded, plan.replace(tp=1)).program))
        plain = max(stage_activations(rewrite_loaded(loaded, plan).program))
        sp = max(stage_activations(rewrite_loaded(loaded, plan.replace(sequence_parallel=True)).program))
        print(f"{f'tp=1 pp={plan.pp} (ideal: / {plan.tp})':28} {mib(whole / plan.tp):>30}", flush=True)
        print(f"{f'tp={plan.tp} pp={plan.pp}':28} {mib(plain):>30}", flush=True)
        print(f"{f'tp={plan.tp} pp={plan.pp} sequence-parallel':28} {mib(sp):>30} {sp / plain:12.2f} "
              f"{sp / (whole / plan.tp):15.2f}", flush=True)


if __name__ == "__main__":
    main()
