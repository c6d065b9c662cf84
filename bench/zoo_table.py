"""The model zoo's table: every architecture x plan, passes / refused / fails and why.

    python bench/zoo_table.py                      # every row at pp 2, tp 2, dp 2 x pp 2 x tp 2 (~6 min)
    python bench/zoo_table.py --only T5 ViT        # some rows

Each cell is tests/test_zoo.py's check (tests/test_hf_models.py's and test_hf_moe.py's for the
five architectures with model files of their own): the local backend runs every stage, tp
shard and dp replica of the program and compares loss, output and every rank's gradient slice with the untouched
model (fp32, 1e-5 scaled by magnitude); one trace per architecture. A cell says "passes" with the
largest scaled difference, "refused" with graphsplit's one-line message, or "FAILS" with the
first mismatch or error. The last column lists what tp left whole (replicated, still correct)
and why. Prints markdown for README.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))

import zoo  # noqa: E402

from graphsplit.errors import GraphsplitError  # noqa: E402
from graphsplit.ir.program import Program  # noqa: E402
from graphsplit.launch.parity import check_locally  # noqa: E402
from graphsplit.loader import LoadedModel, load_model  # noqa: E402
from graphsplit.plan import Plan  # noqa: E402
from graphsplit.rewrite import trace_loaded  # noqa: E402

PLANS = {"pp 2": Plan(pp=2), "tp 2": Plan(tp=2), "dp 2 x pp 2 x tp 2": Plan(dp=2, pp=2, tp=2)}
# architectures with model files of their own (tests/test_hf_models.py, tests/test_hf_moe.py)
FILES = {
    "GPT-2": ("causal LM", "fused c_attn (Conv1D), tied LM head", "hf_gpt2.py"),
    "Llama": ("causal LM", "GQA, rotary, SwiGLU", "hf_llama.py"),
    "Mixtral": ("causal LM", "MoE, top-2 routing, grouped experts", "hf_mixtral.py"),
    "Qwen3-MoE": ("causal LM", "MoE, qk-norm", "hf_qwen3_moe.py"),
    "DeepSeek-V3": ("causal LM", "multi-head latent attention, shared + routed experts", "hf_deepseek_v3.py"),
}


def rows(only: Iterable[str] | None) -> list[tuple[str, str, str, LoadedModel]]:
    found = [(n, fam, feat, load_model(str(ROOT / "tests" / "models" / f))) for n, (fam, feat, f) in FILES.items()]
    found += [(a.name, a.family, a.features, zoo.loaded(a)) for a in zoo.ARCHS]
    wanted = set(only or ())
    return [r for r in found if not wanted or r[0] in wanted]


def left_whole(program: Program) -> str:
    """What tp left whole, by module pattern (layer indices as *), with the pass's reason."""
    seen: dict[str, str] = {}
    for r in program.replicated:
        module = re.sub(r"\.\d+\.", ".*.", r["module"])
        reason = r["reason"].split("left replicated: ")[-1]
        seen.setdefault(module, reason)
    return "; ".join(f"`{m}`: {why}" for m, why in seen.items())


def cell(loaded: LoadedModel, plan: Plan, traced: object) -> tuple[str, Program | None]:
    try:
        program, cmp = check_locally(loaded, plan, traced=traced)
    except GraphsplitError as exc:
        return f"refused: {exc}", None
    except Exception as exc:  # a crash is a failure to report, not to hide
        return f"FAILS: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", None
    if not cmp.ok:
        return f"FAILS: {cmp.failures[0]}", program
    return f"passes ({cmp.worst[1]:.0e})", program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="row names (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print("| architecture | family | exercises | " + " | ".join(PLANS) + " | left whole under tp (correct, not sharded) |")
    print("|---" * (4 + len(PLANS)) + "|")
    start = time.perf_counter()
    counts = {p: 0 for p in PLANS}
    chosen = rows(args.only)
    for name, family, features, loaded in chosen:
        try:
            traced = trace_loaded(loaded)
        except GraphsplitError as exc:
            print(f"| {name} | {family} | {features} | " + " | ".join([f"refused: {exc}"] * len(PLANS)) + " | |")
            continue
        cells, whole = [], ""
        for label, plan in PLANS.items():
            text, program = cell(loaded, plan, traced)
            counts[label] += text.startswith("passes")
            cells.append(text)
            if program is not None and plan.tp > 1 and plan.pp == 1:
                whole = left_whole(program) or "nothing"
        print(f"| {name} | {family} | {features} | " + " | ".join(cells) + f" | {whole} |", flush=True)
    print()
    print(f"{len(chosen)} architectures; passing: " + ", ".join(f"{p}: {c}/{len(chosen)}" for p, c in counts.items())
          + f"; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
