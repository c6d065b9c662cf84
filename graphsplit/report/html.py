"""report.html: the whole transform on one self-contained page (no server, no network).

`render_report(program, record, stage_code)` returns the HTML text: the page
template (report_template.html, shipped as package data: inline CSS and JS)
with the program's data embedded as JSON. The page draws everything itself:

- an overview: a box per pipeline stage (modules, parameters, FLOPs, memory
  per rank) and the tensors crossing each boundary;
- the graph: a cluster per stage laid out in the browser, each block
  (`layers.7`) one box until clicked open; linears and embeddings coloured by
  parallel style, collectives as their own nodes, checkpointed regions and
  autocast marked; clicking a node shows its op, shape, dtype, sharding and
  the line of the model's code it came from;
- each stage's generated code, and the plan (plan.json).

Only the drawn nodes go into the page (scalars, parameters and plumbing stay
out: report/view.py), so an 80-layer model stays a few MiB and opens in seconds.
"""

from __future__ import annotations

import json
import linecache
import os
from importlib import resources
from typing import Any

from ..ir.meta import SourceLine, info
from ..ir.op_kinds import OpKind
from ..ir.program import Program
from ..ir.sharding import layout_str
from .diagram import COLORS
from .view import ROOT, NodeView, collective_label, stage_views

TEMPLATE = "report_template.html"
_DATA_MARK = "__GRAPHSPLIT_DATA__"


def report_data(program: Program, record: dict[str, Any], stage_code: dict[int, str],
                views: list[list[NodeView]] | None = None) -> dict[str, Any]:
    """What the page shows, as JSON-ready data.

    `record` is plan.json's content (plan, parameters and the transform summary);
    `stage_code` maps a stage index to its generated stage_N.py text.
    """
    sources: dict[SourceLine, int] = {}
    stages = []
    all_views = views if views is not None else stage_views(program)
    for st in program.stages:
        views = all_views[st.index]
        index = {id(v): i for i, v in enumerate(views)}
        stages.append({
            "index": st.index,
            "pp_rank": program.plan.stage_rank(st.index),
            "file": f"stage_{st.index}.py",
            "code": stage_code.get(st.index, ""),
            "nodes": [_node(v, index, sources) for v in views],
        })
    return {
        "record": record,
        "stages": stages,
        "sources": [_source(s) for s in sources],
        "colors": COLORS,
        "autocast": program.plan.autocast,
    }


def _node(view: NodeView, index: dict[int, int], sources: dict[SourceLine, int]) -> dict[str, Any]:
    node = view.node
    spec = view.tensor
    out: dict[str, Any] = {"id": view.name, "role": view.role, "op": _op_name(view), "mod": view.module,
                           "g": "" if view.group == ROOT else view.group,
                           "in": [index[id(p)] for p in view.inputs if id(p) in index]}
    if spec is not None:
        out["shape"] = [s if isinstance(s, int) else str(s) for s in spec.shape]
        out["dtype"] = str(spec.dtype).removeprefix("torch.")
    if view.sharding is not None:
        out["sh"] = layout_str(view.sharding)
    if view.style:
        out["style"] = view.style
    if view.collectives:
        out["coll"] = [collective_label(d, k) for d, k in view.collectives]
    if view.region:
        out["ck"] = view.region
    if view.low_precision:
        out["low"] = 1
    ni = info(node)
    if ni.flops:
        out["fl"] = ni.flops
    if ni.kind != OpKind.OTHER:
        out["kind"] = ni.kind.label
    if view.weights:
        out["w"] = [[w.name, str(w.tensor) if w.tensor is not None else "", str(w.sharding)] for w in view.weights]
    if view.source is not None:
        out["src"] = sources.setdefault(view.source, len(sources))
    if view.inserted:
        out["ins"] = 1
    return out


def _op_name(view: NodeView) -> str:
    node = view.node
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op in ("call_method", "call_module"):
        return str(node.target)
    return node.op


def _source(src: SourceLine) -> list[Any]:
    """[file name, path, line, function, the line's code] (the code read once per line, not per node)."""
    return [os.path.basename(src.file), src.file, src.line, src.function, linecache.getline(src.file, src.line).strip()]


def render_report(program: Program, record: dict[str, Any], stage_code: dict[int, str],
                  views: list[list[NodeView]] | None = None) -> str:
    """The self-contained report.html text."""
    template = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    data = json.dumps(report_data(program, record, stage_code, views), default=str, separators=(",", ":"))
    # `<` only occurs inside JSON strings, where \u003c reads the same: the data can never
    # close its <script> element or open a comment.
    data = data.replace("<", "\\u003c")
    return template.replace(_DATA_MARK, data, 1)
