"""The transform summary: per stage what it holds, costs and sends.

`summarize(program)` returns plain data (what `--json` prints and plan.json
embeds); `render(summary)` draws it as rich tables for people.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.table import Table

from ..ir.meta import group_of
from ..ir.program import Program
from ..planner.schedules import underfilled_note


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _fmt_count(n: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def module_groups(program: Program) -> list[list[str]]:
    """Per stage, the blocks it holds, consecutive numbered blocks merged (`h.0-3`); `~` marks a block split between stages."""
    per_stage = [list(dict.fromkeys(group_of(m) for m in st.modules)) for st in program.stages]
    count: dict[str, int] = {}
    for blocks in per_stage:
        for b in blocks:
            count[b] = count.get(b, 0) + 1
    return [_merge_runs([b if count[b] == 1 else f"~{b}" for b in blocks]) for blocks in per_stage]


def _merge_runs(names: list[str]) -> list[str]:
    """['h.0', 'h.1', 'h.2', 'ln_f'] -> ['h.0-2', 'ln_f']; '~' (partial) names are never merged."""
    out: list[str] = []
    run: tuple[str, int, int] | None = None  # (prefix, first, last)
    for name in [*names, ""]:
        m = re.fullmatch(r"([^~].*)\.(\d+)", name)
        if run and m and m.group(1) == run[0] and int(m.group(2)) == run[2] + 1:
            run = (run[0], run[1], run[2] + 1)
            continue
        if run:
            out.append(f"{run[0]}.{run[1]}" + (f"-{run[2]}" if run[2] != run[1] else ""))
            run = None
        if m:
            run = (m.group(1), int(m.group(2)), int(m.group(2)))
        elif name:
            out.append(name)
    return out


def _fsdp_units(program: Program) -> list[dict[str, Any]]:
    """Per stage, the regions FSDP shards as units of their own (`Program.fsdp_units`, as the backend wraps them)."""
    return [{"stage": st.index, "regions": program.fsdp_units(st.index),
             "reshard_after_forward": program.plan.fsdp_reshards} for st in program.stages]


def summarize(program: Program, transform_seconds: float | None = None, timings: dict[str, float] | None = None) -> dict[str, Any]:
    plan = program.plan
    groups = module_groups(program)
    stages = []
    for st, mods in zip(program.stages, groups):
        stages.append(
            {
                "index": st.index,
                "pp_rank": plan.stage_rank(st.index),
                "modules": mods,
                "params": st.num_params,
                "param_bytes": st.param_bytes,
                "param_bytes_per_rank": program.stage_param_bytes(st.index),
                "flops": st.flops,
                "cost": st.cost,
                "inputs": st.inputs,
                "outputs": st.outputs,
            }
        )
    boundaries = [
        {
            "from_stage": b.index,
            "to_stage": b.index + 1,
            "bytes": b.nbytes,
            "values": [
                {"name": v, "shape": [int(x) for x in s.shape], "dtype": str(s.dtype).removeprefix("torch."), "bytes": s.nbytes}
                for v, s in zip(b.values, b.specs)
            ],
        }
        for b in program.boundaries
    ]
    data: dict[str, Any] = {
        "tracer": program.traced.tracer,
        "tracer_reason": program.traced.reason,
        # where each input holds the batch (analysis/batch/), and what was assumed
        "batch": program.batch.to_dict(program.traced.input_names),
        "batch_text": program.batch.describe(program.traced.input_names),
        "plan": plan.to_dict(),
        "num_stages": plan.num_stages,
        "microbatches": plan.num_microbatches,
        "note": underfilled_note(plan),
        "balance": program.balance(),
        "stages": stages,
        "boundaries": boundaries,
        "tied_parameters": program.shared_params,
        "fp8_modules": list(program.fp8_modules),
    }
    if plan.checkpoint != "none" or plan.checkpoint_overrides:
        data["activation_bytes"] = _activation_bytes(program)
    if plan.fsdp:
        data["fsdp_units"] = _fsdp_units(program)
    if plan.tp > 1:
        import torch.fx as fx

        from ..analysis.collectives import (
            collective_volume,
            collectives,
            count_table,
            sequence_sharded,
        )
        from ..ops.activation_checkpoint import CheckpointRegion

        graphs = [m.graph for st in program.stages for m in st.gm.modules() if isinstance(m, fx.GraphModule)]
        found = collectives(graphs)
        # checkpointed regions run their forward collectives again during backward
        regions = [m.inner.graph for st in program.stages for m in st.gm.modules()
                   if isinstance(m, CheckpointRegion) and m.recompute]
        found += [(b, "recompute", k) for b, d, k in collectives(regions) if d == "forward"]
        if program.loss_gm is not None:
            found += collectives([program.loss_gm.graph], default_block="loss")
            data["loss"] = "vocab-parallel cross-entropy (logits stay sharded)"
        data["collectives"] = count_table(found)
        data["collective_bytes"] = collective_volume(
            graphs + ([program.loss_gm.graph] if program.loss_gm is not None else []), plan.tp)
        if plan.sequence_parallel:
            data["sequence_sharded"] = sequence_sharded(graphs)
        data["parameter_shardings"] = {k: str(v) for k, v in program.param_shardings.items()}
        data["left_replicated"] = program.replicated
    if plan.ep > 1 and program.expert_layers:
        data["experts"] = expert_placement(program)
    if plan.cp > 1 and program.batch.sequence is not None:
        data["context_parallel"] = sequence_exchange(program)
    if transform_seconds is not None:
        data["transform_seconds"] = transform_seconds
    if timings:
        data["timings"] = timings
    return data


def expert_placement(program: Program) -> list[dict[str, Any]]:
    """Per MoE layer under expert parallelism: which expert-parallel rank holds which experts, and the
    bytes one rank sends in each of its all-to-alls per micro-batch (a balanced routing: (ep-1)/ep of its
    routed rows leave it; dispatch and combine forward, the same two backward)."""
    import torch.fx as fx

    from ..ir.meta import info
    from ..ops.ep import ep_combine, ep_dispatch, ep_return, ep_route_rows, ep_send, ep_unroute_rows

    ep = program.plan.ep
    sent: dict[int, dict[str, int]] = {}

    def leaving(*values: object) -> int:  # a balanced routing: (ep - 1) / ep of the rows leave the rank
        specs = [info(v).tensor for v in values if isinstance(v, fx.Node)]
        return sum(s.nbytes for s in specs if s is not None) * (ep - 1) // ep

    routes: dict[str, int] = {}  # a stacked weight gathered per row: each routing index's layer

    def add(layer: int, way: str, nbytes: int) -> None:
        sent.setdefault(layer, {})[way] = sent.get(layer, {}).get(way, 0) + nbytes

    for st in program.stages:
        for m in st.gm.modules():
            if not isinstance(m, fx.GraphModule):
                continue
            for node in m.graph.nodes:
                if node.op != "call_function":
                    continue
                if node.target is ep_route_rows:  # every op reading the gather exchanges its rows (its layer's,
                    # named by the first of them)
                    if int(node.args[3]) >= 0:
                        routes[node.args[0].name] = int(node.args[3])
                    layer = routes.get(node.args[0].name)
                    if layer is not None:
                        add(layer, "dispatch", leaving(*node.args[4:]))
                        add(layer, "combine", leaving(*(u for u in node.users if u.target is ep_unroute_rows)))
                elif node.target is ep_dispatch:
                    sent.setdefault(int(node.args[3]), {})["dispatch"] = leaving(node.args[0])
                elif node.target is ep_combine:
                    sent.setdefault(int(node.args[1].args[3]), {})["combine"] = leaving(node.args[0])
                elif node.target is ep_send:  # a loop of experts: each expert's rows, sized by the data
                    sent.setdefault(int(node.args[1]), {})["dispatch"] = leaving(*node.args[2:])
                    if any(info(p).sizes_follow_data for p in node.args[2:] if isinstance(p, fx.Node)):
                        sent[int(node.args[1])]["at_most"] = 1
                elif node.target is ep_return:  # its experts' outputs, one row per routed row
                    pieces, outputs = node.args[2], node.args[3]
                    x, y = info(pieces[0]).tensor, info(outputs[0]).tensor
                    scale = (y.nbytes / max(y.shape[0], 1)) / (x.nbytes / max(x.shape[0], 1)) if x and y and x.nbytes else 1
                    layer = int(node.args[1].args[0].args[1])
                    sent.setdefault(layer, {})["combine"] = int(leaving(*pieces) * scale)
    out = []
    for index, layer in enumerate(program.expert_layers):
        volume = sent.get(index, {})
        out.append({"module": layer.module, "experts": layer.experts,
                    "ranks": [{"ep_rank": r, "first": a, "last": b} for r, (a, b) in enumerate(layer.ranks_hold(ep))],
                    "all_to_all_bytes": {"dispatch": volume.get("dispatch", 0), "combine": volume.get("combine", 0)},
                    # each expert's rows picked by value: sized as if every row went to every expert
                    "at_most": bool(volume.get("at_most"))})
    return out


def sequence_exchange(program: Program) -> dict[str, Any]:
    """Under context parallelism: how each sample's sequence is cut (each rank's chunks r and 2cp-1-r
    of 2cp), and per attention call the keys and values one rank gathers per micro-batch (all-gather
    forward, reduce-scatter of their gradients backward: (cp-1)/cp of the whole sequence's)."""
    import torch.fx as fx

    from ..ir.meta import info, module_path
    from ..ops.context_parallel import cp_attention

    cp = program.plan.cp
    seq = program.batch.sequence
    assert seq is not None
    calls = []
    for st in program.stages:
        for m in st.gm.modules():
            if not isinstance(m, fx.GraphModule):
                continue
            for node in m.graph.nodes:
                if node.op == "call_function" and node.target is cp_attention:
                    shard = sum(info(x).tensor.nbytes for x in node.args[1:3]
                                if isinstance(x, fx.Node) and info(x).tensor is not None)
                    calls.append({"stage": st.index, "module": info(node).module or module_path(node),
                                  "gathered_bytes": shard * (cp - 1), "causal": bool(node.kwargs.get("is_causal"))})
    chunk = seq.length // (2 * cp)
    return {"cp": cp, "length": seq.length, "chunk": chunk,
            "ranks": [{"cp_rank": r, "positions": [[r * chunk, (r + 1) * chunk - 1],
                                                   [(2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk - 1]]}
                      for r in range(cp)],
            "inputs": {k: v for k, v in seq.inputs.items() if v is not None}, "attention": calls}


def _activation_bytes(program: Program) -> list[dict[str, Any]]:
    """Per stage, bytes saved for backward per micro-batch with and without checkpointing (measured)."""

    from ..analysis.memory import gathered_dtype, saved_bytes

    rows = []
    dtype = gathered_dtype(program.plan)
    for st in program.stages:
        inputs = st.input_examples()
        tp, shardings = program.plan.tp, program.param_shardings
        names = {id(st.gm.get_parameter(local)): canonical for local, canonical in st.param_sources.items()}
        rows.append({"stage": st.index, "without": saved_bytes(st.gm, inputs, tp, False, shardings, names, dtype),
                     "with": saved_bytes(st.gm, inputs, tp, True, shardings, names, dtype)})
    return rows


def render(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    plan = summary["plan"]
    title = (
        f"graphsplit: {summary['num_stages']} stages on pp={plan['pp']}, tp={plan['tp']} "
        f"({plan['schedule']}, {summary['microbatches']} micro-batches, traced with {summary['tracer']})"
    )
    table = Table(title=title, title_justify="left")
    for col in ("stage", "rank", "modules", "params", "bytes/rank", "FLOPs/mb", "sends"):
        table.add_column(col, justify="left" if col in ("modules", "sends") else "right")
    sends = {b["from_stage"]: b for b in summary["boundaries"]}
    for st in summary["stages"]:
        b = sends.get(st["index"])
        sent = (
            f"{_fmt_bytes(b['bytes'])}: " + ", ".join(f"{v['name']} {v['dtype']}{v['shape']}" for v in b["values"])
            if b
            else "-"
        )
        table.add_row(
            str(st["index"]),
            str(st["pp_rank"]),
            ", ".join(st["modules"]),
            _fmt_count(st["params"]),
            _fmt_bytes(st["param_bytes_per_rank"]),
            _fmt_count(st["flops"]),
            sent,
        )
    console.print(table)
    if summary.get("tracer_reason"):
        console.print(f"traced with {summary['tracer_reason']}")
    if summary.get("batch_text"):
        console.print(f"batch: {summary['batch_text']}")
        for line in summary["batch"]["notes"]:
            console.print(f"note: {line}")
    if summary.get("note"):
        console.print(f"note: {summary['note']}")
    console.print(f"balance (max stage cost / mean): {summary['balance']:.3f}")
    if summary["tied_parameters"]:
        tied = ", ".join(f"{k} (stages {', '.join(map(str, v))})" for k, v in summary["tied_parameters"].items())
        console.print(f"tied parameters, gradients summed across stages: {tied}")
    if summary.get("fp8_modules"):
        names = summary["fp8_modules"]
        console.print(f"fp8 ({plan['fp8']}): {len(names)} linears in float8: {', '.join(names[:6])}"
                      f"{f' and {len(names) - 6} more' if len(names) > 6 else ''}")
    if summary.get("fsdp_units"):
        console.print(f"FSDP over dp={plan['dp']}: " + "; ".join(
            f"stage {u['stage']}: " + (f"{len(u['regions'])} block units ({u['regions'][0]}..{u['regions'][-1]}"
                                       f"{', freed after each forward' if u['reshard_after_forward'] else ''}) and one "
                                       "for the rest" if u["regions"] else "one unit")
            for u in summary["fsdp_units"]))
    if "activation_bytes" in summary:
        parts = [
            f"stage {r['stage']}: {_fmt_bytes(r['with']) if r['with'] is not None else 'not measured'} "
            f"(without: {_fmt_bytes(r['without'])})"
            for r in summary["activation_bytes"]
        ]
        policy = plan["checkpoint"] + "".join(f", {glob}={p}" for glob, p in plan.get("checkpoint_overrides", []))
        console.print(f"saved for backward per micro-batch, checkpoint={policy}: " + "; ".join(parts))
    if "collectives" in summary:
        _render_collectives(summary, console)
    if summary.get("experts"):
        _render_experts(summary, console)
    if summary.get("context_parallel"):
        _render_context_parallel(summary["context_parallel"], console)
    if "transform_seconds" in summary:
        console.print(f"transform took {summary['transform_seconds']:.2f} s")


def _render_collectives(summary: dict[str, Any], console: Console) -> None:
    coll = summary["collectives"]

    def fmt(counts: dict[str, dict[str, int]]) -> str:
        short = {"forward": "fwd", "backward": "bwd", "recompute": "recomputed in bwd"}
        parts = [f"{n} {kind.replace('_', '-')} {short[direction]}" for direction in short
                 for kind, n in sorted(counts.get(direction, {}).items())]
        return ", ".join(parts) or "none"

    console.print(f"tensor-parallel collectives per step and micro-batch: {fmt(coll['total'])}")
    if summary.get("collective_bytes"):
        short = {"forward": "fwd", "backward": "bwd"}
        volume = summary["collective_bytes"]
        parts = [f"{_mib(n)} {kind.replace('_', '-')} {short[d]}" for d in short
                 for kind, n in sorted(volume.get(d, {}).items())]
        console.print(f"  volume per rank and micro-batch (message sizes): {', '.join(parts)}")
    if summary.get("sequence_sharded"):
        where = summary["sequence_sharded"]
        blocks = list(where)
        shown = ", ".join(blocks[:6]) + (f" (+{len(blocks) - 6} more)" if len(blocks) > 6 else "")
        console.print(f"  sequence parallel: {sum(where.values())} ops on the tokens' shard [.., s/tp, h] "
                      f"(norms, dropout, residual adds) in {shown}")
    if "loss" in summary:
        console.print(f"  loss: {summary['loss']}")
    by_counts: dict[str, list[str]] = {}
    for block, counts in coll["per_block"].items():
        by_counts.setdefault(fmt(counts), []).append(block)
    for text, blocks in by_counts.items():
        shown = ", ".join(blocks[:6]) + (f" (+{len(blocks) - 6} more)" if len(blocks) > 6 else "")
        console.print(f"  {shown}: {text}")
    groups: dict[tuple[str, str], int] = {}
    for item in summary.get("left_replicated", []):
        key = (re.sub(r"\.\d+\.", ".*.", item["module"]), re.sub(r"\[\d+, ", "[", item["reason"]))
        groups[key] = groups.get(key, 0) + 1
    for (module, reason), n in groups.items():
        console.print(f"  left whole: {module}{f' (x{n})' if n > 1 else ''}: {reason}")


def _render_experts(summary: dict[str, Any], console: Console) -> None:
    ep = summary["plan"]["ep"]
    console.print(f"expert parallel over {ep} ranks (each {ep} consecutive dp ranks), tokens exchanged by all-to-alls: "
                  "2 forward (dispatch, combine), 2 backward, per MoE layer and micro-batch")
    groups: dict[str, list[str]] = {}
    for layer in summary["experts"]:
        holds = ", ".join(f"rank {r['ep_rank']}: {r['first']}-{r['last']}" if r["first"] != r["last"]
                          else f"rank {r['ep_rank']}: {r['first']}" for r in layer["ranks"])
        volume = layer["all_to_all_bytes"]
        bound = " at most (each expert's rows sized as all the rows: they follow the data)" if layer.get("at_most") else ""
        text = (f"{layer['experts']} experts ({holds}); sent per rank (balanced routing){bound}: "
                f"dispatch {_mib(volume['dispatch'])}, combine {_mib(volume['combine'])}")
        groups.setdefault(text, []).append(layer["module"])
    for text, modules in groups.items():
        shown = ", ".join(modules[:4]) + (f" (+{len(modules) - 4} more)" if len(modules) > 4 else "")
        console.print(f"  {shown}: {text}")


def _render_context_parallel(found: dict[str, Any], console: Console) -> None:
    cp, calls = found["cp"], found["attention"]
    where = ", ".join(f"{k} dim {v}" for k, v in found["inputs"].items())
    ranks = "; ".join(f"rank {r['cp_rank']}: {a[0]}-{a[1]} and {b[0]}-{b[1]}" for r in found["ranks"]
                      for a, b in [r["positions"]])
    console.print(f"context parallel over {cp} ranks (each {cp} consecutive dp ranks hold the same samples): "
                  f"each {found['length']}-token sequence ({where}) cut in {2 * cp} chunks, {ranks}")
    if calls:
        per = {c["gathered_bytes"] for c in calls}
        console.print(f"  {len(calls)} attention calls ({sum(c['causal'] for c in calls)} causal) gather keys and "
                      f"values: {', '.join(_mib(b) for b in sorted(per))} per rank and micro-batch each (all-gather "
                      "forward, reduce-scatter backward)")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"
