"""A run's training curves: the `--metrics` file of `graphsplit run`, read back by `graphsplit inspect`.

    graphsplit run model.py --dp 2 --pp 2 --steps 200 --metrics out/metrics.jsonl
    graphsplit inspect out/metrics.jsonl      # or: graphsplit inspect out  (a folder holding metrics.jsonl)

`inspect` prints the steps as a table and puts the curves (loss and eval loss,
learning rate, gradient norm, throughput) as inline SVG into the folder's
report.html, between the TRAINING_BEGIN and TRAINING_END marks: a transform's
report gains a Training tab; a folder with no report gets a page of its own.
Re-running inspect replaces the section. A step logged twice (a run resumed
from an earlier checkpoint trains it again) counts as its latest line.
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Any

from ..errors import GraphsplitError
from ..runtime.atomic import write_file_atomically
from .artifacts import REPORT_FILE
from .curves import Series, line_chart

METRICS_FILE = "metrics.jsonl"  # what inspect looks for in a folder
TRAINING_BEGIN = "<!-- graphsplit:training -->"
TRAINING_END = "<!-- /graphsplit:training -->"
MAX_TABLE_ROWS = 25  # a long run's table: evenly spaced steps, the first and the last among them


def find_metrics(path: Path) -> Path | None:
    """The metrics file `path` names: a .jsonl file itself, or a folder's metrics.jsonl; None for neither."""
    if path.suffix == ".jsonl" and not path.exists():
        raise GraphsplitError(f"{path} does not exist; write it with graphsplit run MODEL --metrics {path}")
    if path.is_file():
        return path if path.suffix == ".jsonl" else None
    candidate = path / METRICS_FILE
    return candidate if candidate.is_file() else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The lines of a --metrics file, one per step in step order (a step's latest line wins)."""
    remedy = f"give the file graphsplit run ... --metrics {path} wrote"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GraphsplitError(f"{path} is not text (byte {exc.start} is not UTF-8); {remedy}") from exc
    except OSError as exc:
        raise GraphsplitError(f"cannot read {path}: {exc.strerror or exc}") from exc
    by_step: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GraphsplitError(f"{path} line {number} is not JSON ({exc.msg}); {remedy}") from exc
        if not (isinstance(row, dict) and _is_int(row.get("step")) and "loss" in row
                and _is_number_or_null(row["loss"])):
            raise GraphsplitError(f"{path} line {number} is not a metrics line (each holds an integer 'step' "
                                  f"and a 'loss'); {remedy}")
        by_step[row["step"]] = row
    if not by_step:
        raise GraphsplitError(f"{path} holds no steps; the run wrote it before its first step ended")
    return [by_step[s] for s in sorted(by_step)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of the steps with a finite `key` (a non-finite number was written as null)."""
    return [(r["step"], float(r[key])) for r in rows
            if _is_number_or_null(r.get(key)) and r.get(key) is not None and math.isfinite(r[key])]


def throughput_key(rows: list[dict[str, Any]]) -> str | None:
    return next((k for k in ("tokens_per_second", "samples_per_second") if any(k in r for r in rows)), None)


def charts(rows: list[dict[str, Any]]) -> list[str]:
    """The SVG charts of a run: loss (and eval loss), lr, gradient norm, throughput."""
    out = [line_chart("loss", [Series("loss", _points(rows, "loss"), "#2563eb"),
                               Series("eval loss", _points(rows, "eval_loss"), "#dc2626")])]
    for key, title, color in (("lr", "learning rate", "#7a3db8"), ("grad_norm", "gradient norm", "#0f766e")):
        if _points(rows, key):
            out.append(line_chart(title, [Series(key, _points(rows, key), color)]))
    rate = throughput_key(rows)
    if rate and _points(rows, rate):
        out.append(line_chart(rate.replace("_", " "), [Series(rate, _points(rows, rate), "#b45309")]))
    return out


def training_section(rows: list[dict[str, Any]], source: str) -> str:
    """The HTML of the Training section (marks included): a line of totals, the charts, and where from."""
    losses = _points(rows, "loss")
    facts = [f"{len(rows)} steps ({rows[0]['step']} to {rows[-1]['step']})"]
    if losses:
        low = min(losses, key=lambda p: p[1])
        facts.append(f"loss {losses[0][1]:.4g} at step {losses[0][0]}, {losses[-1][1]:.4g} at step "
                     f"{losses[-1][0]} (lowest {low[1]:.4g} at step {low[0]})")
    evals = _points(rows, "eval_loss")
    if evals:
        facts.append(f"eval loss {evals[-1][1]:.4g} at step {evals[-1][0]}")
    clipped = sum(1 for r in rows if r.get("clipped"))
    if clipped:
        facts.append(f"{clipped} step(s) clipped")
    return (f"{TRAINING_BEGIN}\n<h2>Training</h2>\n<p>{escape('; '.join(facts))}</p>\n"
            f'<div class="charts">{"".join(charts(rows))}</div>\n'
            f'<p class="muted">from {escape(source)}</p>\n{TRAINING_END}')


CHART_CSS = (".charts { display: flex; flex-wrap: wrap; gap: 12px; }\n"
             "svg.chart { border: 1px solid var(--line); border-radius: 8px; background: var(--panel); "
             "font: 11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; fill: var(--muted); }\n"
             "svg.chart .frame { fill: #fff; stroke: var(--line); }\n"
             "svg.chart .chart-title { font: 600 12px -apple-system, BlinkMacSystemFont, 'Segoe UI', "
             "Helvetica, Arial, sans-serif; fill: var(--fg); }\n")

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>graphsplit training: {title}</title>
<!-- Written by graphsplit inspect. Self-contained: no server, no network, no script. -->
<style>
:root {{ --fg: #1d2330; --muted: #667085; --line: #d0d5dd; --bg: #ffffff; --panel: #f8f9fb; }}
body {{ font: 13px/1.45 -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif;
  color: var(--fg); background: var(--bg); margin: 0; padding: 10px 18px; }}
h1 {{ font-size: 17px; margin: 0 0 2px; }} h2 {{ font-size: 15px; margin: 18px 0 8px; }}
.muted {{ color: var(--muted); }}
{css}</style>
</head>
<body>
<h1>graphsplit training: {title}</h1>
{section}
</body>
</html>
"""


def training_page(rows: list[dict[str, Any]], source: Path) -> str:
    """A report.html of its own, for a folder that holds a run's metrics and no transform."""
    return _PAGE.format(title=escape(source.name), css=CHART_CSS, section=training_section(rows, str(source)))


def check_report_writable(report: Path) -> None:
    """A report.html inspect may write: absent, or holding the training marks (never a user's page)."""
    if report.exists() and TRAINING_BEGIN not in report.read_text(encoding="utf-8", errors="replace"):
        raise GraphsplitError(f"{report} has no place for the training curves (not written by graphsplit, or by "
                              "an older one); re-run graphsplit transform to rewrite it, or move it away")


def write_training_report(folder: Path, rows: list[dict[str, Any]], source: Path) -> Path:
    """Put the curves into `folder`/report.html: replace its training section, or write a page of its own."""
    report = folder / REPORT_FILE
    check_report_writable(report)
    if not report.exists():
        text = training_page(rows, source)
    else:
        text = report.read_text(encoding="utf-8")
        begin, end = text.index(TRAINING_BEGIN), text.index(TRAINING_END) + len(TRAINING_END)
        text = text[:begin] + training_section(rows, str(source)) + text[end:]
    write_file_atomically(report, text)
    return report


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MAX_TABLE_ROWS of `rows`, evenly spaced, the first and the last kept."""
    if len(rows) <= MAX_TABLE_ROWS:
        return rows
    picks = sorted({round(i * (len(rows) - 1) / (MAX_TABLE_ROWS - 1)) for i in range(MAX_TABLE_ROWS)})
    return [rows[i] for i in picks]


def render_table(rows: list[dict[str, Any]], console: Any) -> None:
    """The steps as a rich table (a long run's evenly spaced among them); fits 80 columns."""
    from rich import box
    from rich.table import Table

    rate = throughput_key(rows)
    shown = table_rows(rows)
    title = f"{len(rows)} steps" + (f" (showing {len(shown)})" if len(shown) < len(rows) else "")
    clipped = any(r.get("clipped") for r in shown)
    table = Table(title=title, title_justify="left", box=box.SIMPLE, pad_edge=False, collapse_padding=True,
                  caption="* clipped" if clipped else None, caption_justify="left")
    unit = {"tokens_per_second": "tok/s", "samples_per_second": "smp/s"}.get(rate or "", "rate")
    for name in ("step", "loss", "eval loss", "lr", "grad norm", unit, "s/step", "mem MiB"):
        table.add_column(name, justify="right", no_wrap=True)

    def num(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in shown:
        memory = r.get("max_memory_bytes")
        table.add_row(str(r["step"]), num(r.get("loss"), ".6f"), num(r.get("eval_loss"), ".6f"), num(r.get("lr"), ".3e"),
                      num(r.get("grad_norm"), ".4g") + ("*" if r.get("clipped") else ""),
                      num(r.get(rate) if rate else None, ",.0f"), num(r.get("step_seconds"), ".3f"),
                      "-" if not memory else f"{memory / 2**20:,.0f}")
    console.print(table)
