"""`graphsplit plan`'s output: the best plans as a table, or why nothing fits; and the plan file.

The plan file (`--out`) holds the plan under "plan" (what `transform --plan`, `run --plan`
and `Plan.load` read) and the planner's prediction beside it, so a later measurement can
be set against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..planner.search import SearchResult
from .summary import _fmt_bytes

MEMORY_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "outputs_and_loss",
                "communication_buffers", "total")


def _plan_cell(p: dict[str, Any]) -> str:
    ep = f" ep{p['ep']}" if p.get("ep", 1) > 1 else ""
    ep += f" cp{p['cp']}" if p.get("cp", 1) > 1 else ""
    sched = "" if p["pp"] == 1 else f" {p['schedule']}" + (f"x{p['stages_per_rank']}" if p["stages_per_rank"] > 1 else "")
    return (f"tp{p['tp']}{' sp' if p.get('sequence_parallel') else ''}{' async' if p.get('async_tp') else ''} pp{p['pp']} dp{p['dp']}"
            f"{(' zero2' if p.get('zero') == 2 else ' fsdp') if p['fsdp'] else ' zero1' if p.get('zero') == 1 else ''}"
            f"{ep} mb{p['microbatches']}{sched} "
            f"{p['checkpoint']} {p['autocast'] or 'fp32'}{' fp8-' + p['fp8'] if p.get('fp8') else ''}"
            f"{' compiled' if p.get('compile') else ''}")


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.1f}"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"


def render(result: SearchResult, header: str, top: int = 10, console: Console | None = None) -> None:
    # 15 columns: when printing to a file or a pipe, do not squeeze them into 80
    console = console or Console(width=None if Console().is_terminal else 220)
    console.print(header)
    left = sum(result.left_out.values())
    console.print(f"{result.considered} plans priced, {left} left out, {len(result.plans)} fit; "
                  f"searched in {result.search_seconds:.2f} s")
    for reason, count in result.left_out.most_common(5):
        console.print(f"  left out ({count}): {reason}")
    if not result.fits:
        closest = result.closest.to_dict() if result.closest else None
        if closest is not None:
            console.print(f"nothing fits: the leanest plan, {_plan_cell(closest['plan'])}, needs "
                          f"{_fmt_bytes(closest['memory']['total'])} per rank; its largest part is "
                          f"{(result.too_large or '').replace('_', ' ')}")
        needed = f"about {result.devices_needed} devices" if result.devices_needed else "more devices than 2**20"
        console.print(f"it would take {needed} of this memory")
        return
    table = Table(title="best plans, fastest first (memory: busiest rank)")
    for column in ("plan", "params", "grads", "optim", "acts", "out+loss", "buffers", "total", "step",
                   "samples/s", "tokens/s", "MFU", "bubble", "tp comm", "dp exposed"):
        table.add_column(column, justify="left" if column == "plan" else "right", no_wrap=True)
    for est in result.plans[:top]:
        d = est.to_dict()
        mem = d["memory"]
        table.add_row(
            _plan_cell(d["plan"]), *(_fmt_bytes(mem[k]) for k in MEMORY_PARTS), _seconds(d["step_seconds"]),
            _rate(d["samples_per_second"]), _rate(d["tokens_per_second"]), f"{d['mfu']:.1%}", f"{d['bubble']:.0%}",
            _seconds(d["time"]["tp_collectives"]), _seconds(d["time"]["dp_exposed"]),
        )
    console.print(table)
    if why := why_cp(result):
        console.print(why)


def why_cp(result: SearchResult) -> str:
    """Why the best plan cuts each sample's sequence (cp > 1): what the best plan without it costs;
    or why context parallelism was not tried on a long sequence."""
    if not result.plans:
        return ""
    best = result.plans[0]
    if best.plan.cp == 1:
        return f"context parallelism not tried: {result.no_cp}" if result.no_cp else ""
    plan = best.plan
    tokens = f"{round(best.tokens_per_second / best.samples_per_second):,} tokens" \
        if best.tokens_per_second and best.samples_per_second else "sequence"
    text = (f"cp{plan.cp}: each sample's {tokens} cut over {plan.cp} ranks (drawn from dp{plan.dp}: "
            f"{plan.sample_replicas} sample replica{'s' if plan.sample_replicas > 1 else ''}), so each rank runs and "
            f"keeps 1/{plan.cp} of it; ")
    without = next((e for e in result.plans if e.plan.cp == 1), None)
    if without is None:
        return text + "no plan without context parallelism fits"
    slower = without.step_seconds / best.step_seconds - 1
    return text + (f"the fastest plan without it, {_plan_cell(without.to_dict()['plan'])}, takes "
                   f"{_seconds(without.step_seconds)} a step ({slower:.0%} slower)")


def write_plan_file(path: Path, result: SearchResult, context: dict[str, Any]) -> None:
    """The winning plan and its prediction, written whole (a temporary file renamed into place)."""
    from ..runtime.atomic import write_file_atomically

    best = result.plans[0]
    record = {"plan": best.plan.to_dict(), "predicted": best.to_dict(), **context}
    write_file_atomically(path, json.dumps(record, indent=2) + "\n")


def price_command(loaded: Any, plan: Any, gpus: int, memory: int, gpus_per_node: int | None, hw: Any, optimizer: str,
                  as_json: bool, console: Console | None = None) -> None:
    """`graphsplit plan MODEL --gpus N --tp .. --pp ..`: the given plan priced, and the search's best beside it."""
    from ..planner.price import check_priceable, price_plan
    from ..planner.profile import profile_model

    check_priceable(plan, gpus, hw)  # before the profile: a wrong device count costs nothing
    profile = profile_model(loaded, (plan.tp,), hw.fused_attention)
    priced = price_plan(profile, plan, hw, memory, gpus, gpus_per_node or hw.gpus_per_node, optimizer)
    if as_json:
        print(json.dumps({"model": str(loaded.path), "hardware": hw.name, "batch": profile.batch, **priced.to_dict()},
                         indent=2))
        return
    console = console or Console(width=None if Console().is_terminal else 220)
    est = priced.estimate.to_dict()
    console.print(f"{loaded.path.name}: {_plan_cell(est['plan'])} on {gpus} x {hw.name}, {memory / 2**30:.1f} GiB each; "
                  f"global batch {profile.batch}" + (f" x {profile.tokens_per_sample} tokens" if profile.tokens_per_sample else ""))
    verdict = "fits" if priced.fits else "does NOT fit"
    console.print(f"memory (busiest rank): {_fmt_bytes(est['memory']['total'])}, {verdict} in "
                  f"{_fmt_bytes(priced.budget)} usable: " + ", ".join(
                      f"{k.replace('_', ' ')} {_fmt_bytes(est['memory'][k])}" for k in MEMORY_PARTS[:-1]))
    console.print(f"step {_seconds(est['step_seconds'])}: {_rate(est['samples_per_second'])} samples/s, "
                  f"{_rate(est['tokens_per_second'])} tokens/s, MFU {est['mfu']:.1%}, bubble {est['bubble']:.0%}")
    t = est["time"]
    console.print("  " + ", ".join(f"{label} {_seconds(t[k])}" for k, label in TIME_LABELS.items()
                                   if k in ("compute_and_tp", "bubble") or t.get(k)))
    if t.get("dp_collectives"):
        hidden = t["dp_collectives"] - t["dp_exposed"]
        console.print(f"  dp traffic {_seconds(t['dp_collectives'])}, {_seconds(hidden)} of it hidden behind compute")
    if why := priced.versus_best():
        console.print(why)
    if priced.best is not None and not priced.versus_best().startswith("this is"):
        best = priced.best.to_dict()
        console.print(f"  the search's best: {_plan_cell(best['plan'])}, step {_seconds(best['step_seconds'])}, "
                      f"memory {_fmt_bytes(best['memory']['total'])}")


# the step's parts as the priced plan's breakdown shows them (Estimate.time)
TIME_LABELS = {"compute_and_tp": "compute", "bubble": "bubble", "recompute": "of which recompute",
               "tp_collectives": "of which tp collectives", "pp_sends": "of which pipeline sends",
               "all_to_all": "ep all-to-alls", "cp_exchange": "cp exchange", "dp_exposed": "exposed dp",
               "grad_copies": "gradient copies",
               "optimizer": "optimizer"}
