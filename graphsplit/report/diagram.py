"""The program as a Graphviz graph: one cluster per pipeline stage, one box per block.

`program_dot(program)` returns DOT text (always written as graph.dot); boxes
are the model's blocks (`h.3`, `layers.7`) or top-level modules, each saying
how many linears it holds in which parallel style and which collectives it
runs, coloured by its dominant style; checkpointed and autocast regions are
marked; edges between stages carry the bytes sent per micro-batch.
`render_svg(dot_text)` runs Graphviz's `dot` when it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter

from ..ir.program import Program
from .view import NodeView, collective_label, stage_views

COLORS = {"column": "#cfe2ff", "row": "#ffe5b4", "vocab": "#d1f2d8", "replicated": "#eeeeee"}


def program_dot(program: Program, views: list[list[NodeView]] | None = None) -> str:
    """`views`: the stages' `stage_view`s when the caller has them already (the report uses them too)."""
    plan = program.plan
    views = views if views is not None else stage_views(program)
    out = [
        "digraph graphsplit {",
        '  graph [rankdir=TB, fontname="Helvetica", compound=true];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    firsts, lasts = [], []
    for st in program.stages:
        groups: dict[str, dict] = {}
        for view in views[st.index]:
            if view.role != "op":
                continue
            entry = groups.setdefault(view.group, {"styles": Counter(), "coll": Counter(), "ckpt": False, "low": False})
            if view.style:
                entry["styles"][view.style] += 1
            for direction, kind in view.collectives:
                entry["coll"][collective_label(direction, kind)] += 1
            entry["ckpt"] |= view.region is not None
            entry["low"] |= view.low_precision
        out.append(f"  subgraph cluster_stage{st.index} {{")
        out.append(f'    label="stage {st.index} (pp rank {plan.stage_rank(st.index)}, tp={plan.tp})"; style=rounded; color="#888888";')
        ids = []
        for g, entry in groups.items():
            nid = f"s{st.index}_{len(ids)}"
            ids.append(nid)
            lines = [g]
            if entry["styles"]:
                lines.append(", ".join(f"{n} {s}" for s, n in entry["styles"].most_common()))
            if entry["coll"]:
                lines.append(", ".join(f"{n} {c}" for c, n in sorted(entry["coll"].items())))
            marks = [m for m, on in (("checkpointed", entry["ckpt"]), (str(plan.autocast), entry["low"])) if on]
            if marks:
                lines.append("[" + ", ".join(marks) + "]")
            color = COLORS[entry["styles"].most_common(1)[0][0]] if entry["styles"] else "#f7f7f7"
            border = ', penwidth=2, color="#7a3db8"' if entry["ckpt"] else ""
            label = "\\n".join(x.replace('"', "'") for x in lines)
            out.append(f'    {nid} [label="{label}", fillcolor="{color}"{border}];')
        for a, b in zip(ids, ids[1:]):
            out.append(f"    {a} -> {b};")
        out.append("  }")
        firsts.append(ids[0] if ids else None)
        lasts.append(ids[-1] if ids else None)
    for b in program.boundaries:
        src, dst = lasts[b.index], firsts[b.index + 1]
        if src and dst:
            out.append(f'  {src} -> {dst} [label="{b.nbytes / 1024:.1f} KiB / micro-batch", color="#c0392b"];')
    out.append("}")
    return "\n".join(out) + "\n"


def render_svg(dot_text: str) -> str | None:
    """SVG from Graphviz's `dot`, or None when it is not installed."""
    binary = shutil.which("dot")
    if binary is None:
        return None
    done = subprocess.run([binary, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout if done.returncode == 0 else None
