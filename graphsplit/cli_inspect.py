"""`graphsplit inspect`: a transform folder's saved summary, or a run's metrics as a table and curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .cli_errors import fail
from .errors import GraphsplitError


@click.command()
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary (or a run's steps) as JSON.")
@click.option("--open", "open_report", is_flag=True,
              help="Also open the folder's report.html (overview, graph, stage code, plan, training) in a web browser.")
def inspect(out_dir: Path, as_json: bool, open_report: bool) -> None:
    """Print the summary of a folder written by transform (stages, balance, collectives, memory per rank);
    --open also shows its report.html.

    OUT_DIR may also be a run's --metrics file (or a folder holding metrics.jsonl): its steps are
    printed as a table and its loss, lr, gradient-norm and throughput curves put into the folder's
    report.html (a transform's report gains a Training tab)."""
    from .report.artifacts import PLAN_FILE, REPORT_FILE, read_plan_record
    from .report.training import check_report_writable, find_metrics, read_metrics

    try:
        metrics = find_metrics(out_dir)
        rows = read_metrics(metrics) if metrics is not None else None
        if metrics is not None:
            check_report_writable(metrics.parent / REPORT_FILE)  # before anything is printed
        # a transform's folder (given as the folder) shows its summary, with or without a run's metrics
        summarize = metrics is None or (out_dir.is_dir() and (out_dir / PLAN_FILE).exists())
        report = _report_path(out_dir) if open_report and metrics is None else None
        record = read_plan_record(out_dir) if summarize else None
    except GraphsplitError as exc:
        fail(exc)
        return
    if record is not None:
        _show_summary(record, out_dir, as_json)
    if metrics is not None and rows is not None:
        report = _show_training(metrics, rows, as_json, summarized=record is not None)
    if open_report and report is not None:
        _open_report(report)


def _show_summary(record: dict[str, Any], out_dir: Path, as_json: bool) -> None:
    from .report.summary import render

    summary = record.get("summary")
    if summary is None:
        fail(GraphsplitError(f"{out_dir}/plan.json has no summary; re-run graphsplit transform"))
        return
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    from rich.console import Console

    console = Console()
    try:  # drawn whole before anything is printed: a summary from another version fails cleanly
        with console.capture() as drawn:
            render(summary, console)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        fail(GraphsplitError(f"{out_dir}/plan.json holds a summary this graphsplit cannot read "
                              f"({type(exc).__name__}: {exc}); re-run graphsplit transform MODEL --out {out_dir}"))
        return
    click.echo(f"{record['model']['path']}:{record['model']['factory']} (graphsplit {record['graphsplit_version']}, "
               f"torch {record.get('torch_version', 'unknown')})")
    click.echo(drawn.get(), nl=False)


def _show_training(metrics: Path, rows: list[dict[str, Any]], as_json: bool, summarized: bool) -> Path:
    """A run's steps as a table (as JSON with --json, unless the transform summary took stdout), and its
    curves into the folder's report.html; returns the report's path."""
    from .report.training import render_table, write_training_report

    if as_json and not summarized:
        click.echo(json.dumps(rows, indent=2))
    elif not as_json:
        from rich.console import Console

        click.echo(f"training: {metrics}")
        render_table(rows, Console())
    try:
        report = write_training_report(metrics.parent, rows, metrics)
    except GraphsplitError as exc:
        fail(exc)
        raise  # not reached: _fail exits
    click.echo(f"wrote the training curves to {report}", err=as_json)
    return report


def _report_path(out_dir: Path) -> Path:
    from .report.artifacts import REPORT_FILE

    path = out_dir / REPORT_FILE
    if not path.is_file():
        raise GraphsplitError(f"{out_dir} has no {REPORT_FILE}; run graphsplit transform MODEL --out {out_dir} to write it")
    return path


def _open_report(path: Path) -> None:
    """Open in the user's browser ($BROWSER or the system's); the page needs no server."""
    import webbrowser

    uri = path.resolve().as_uri()
    if webbrowser.open(uri):
        click.echo(f"opened {uri}", err=True)
    else:
        click.echo(f"no web browser found here; open {uri} in one", err=True)
