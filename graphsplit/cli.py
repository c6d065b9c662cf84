"""The `graphsplit` command line (click)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .errors import GraphsplitError
from .plan import SCHEDULES, Plan


def _plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--pp", type=int, default=None, help="Pipeline-parallel ranks."),
        click.option("--tp", type=int, default=None, help="Tensor-parallel ranks (Megatron-style plan found from the graph)."),
        click.option("--dp", type=int, default=None, help="Data-parallel replicas (gradients averaged over them)."),
        click.option("--fsdp", is_flag=True, default=None,
                     help="Shard parameters, gradients and optimizer state over the dp replicas (FSDP2, ZeRO-3)."),
        click.option("--sync-bn", "sync_bn", is_flag=True, default=None,
                     help="BatchNorm statistics over all dp replicas (one all-reduce per layer), not per replica."),
        click.option("--microbatches", type=int, default=None, help="Micro-batches per step (default: number of stages)."),
        click.option("--schedule", type=click.Choice(list(SCHEDULES)), default=None, help="Pipeline schedule (default 1f1b)."),
        click.option("--stages-per-rank", type=int, default=None, help="Virtual stages per pp rank (interleaved schedules)."),
        click.option("--split-at", default=None, help="Comma-separated module names that start a new stage, e.g. h.6,h.12."),
        click.option("--seed", type=int, default=None, help="Seed for the model's initialization (default 0)."),
        click.option("--checkpoint", default=None,
                     help="Activation checkpointing (default none): blocks recomputes each repeated block "
                          "(h.3, layers.7) and the ops after it in its stage (final norm, LM head); "
                          "every:K, K blocks per region; stage, each whole stage; selective, each block "
                          "keeps its matmul/attention outputs and recomputes the cheap ops."),
        click.option("--checkpoint-module", "checkpoint_overrides", multiple=True, metavar="GLOB=POLICY",
                     help="Per-module override, repeatable: modules whose name matches GLOB (h.0, h.1*, "
                          "h.*.mlp) are none (not checkpointed), full (one recomputed region) or "
                          "selective; the last matching one wins, e.g. --checkpoint-module 'h.0=none'."),
        click.option("--autocast", type=click.Choice(["bf16", "fp16"]), default=None,
                     help="Mixed precision: matmuls in this dtype, parameters, norms and the loss in fp32."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


_PLAN_KEYS = ("pp", "tp", "dp", "fsdp", "sync_bn", "microbatches", "schedule", "stages_per_rank", "split_at", "seed", "checkpoint",
              "checkpoint_overrides", "autocast")


def _plan_from(kwargs: dict[str, Any]) -> tuple[Plan, bool]:
    given = {k: kwargs.pop(k) for k in _PLAN_KEYS}
    given = {k: v for k, v in given.items() if v is not None and v != ()}
    if "checkpoint_overrides" in given:
        given["checkpoint_overrides"] = tuple(_override(text) for text in given["checkpoint_overrides"])
    if "split_at" in given:
        given["split_at"] = tuple(s.strip() for s in given["split_at"].split(",") if s.strip())
    if given.get("schedule") in ("interleaved-1f1b", "looped-bfs") and "stages_per_rank" not in given:
        given["stages_per_rank"] = 2
    return Plan(**given), bool(given)


def _override(text: str) -> tuple[str, str]:
    glob, sep, policy = text.rpartition("=")
    if not sep or not glob.strip():
        raise GraphsplitError(f"--checkpoint-module takes GLOB=POLICY (e.g. 'h.0=none'), got {text!r}")
    return glob.strip(), policy.strip()


def _fail(exc: GraphsplitError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(exc.exit_code)


@click.group()
@click.version_option(package_name="graphsplit")
def main() -> None:
    """Turn an ordinary PyTorch model into a pipeline / tensor / data-parallel training program."""


@main.command()
@click.argument("model")
@_plan_options
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None, help="Folder for plan.json and stage code.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout (logs go to stderr).")
def transform(model: str, out_dir: Path | None, as_json: bool, **kwargs: Any) -> None:
    """Plan and rewrite MODEL (path/to/model.py[:factory]); write artifacts to --out."""
    from .api import transform as do_transform
    from .summary import render

    try:
        plan, _ = _plan_from(kwargs)
        result = do_transform(model, plan, out_dir)
    except GraphsplitError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))
        if out_dir is not None:
            click.echo(f"wrote {out_dir}", err=True)
    else:
        render(result.summary)
        if out_dir is not None:
            click.echo(f"wrote {out_dir}/plan.json and {len(result.program.stages)} stage files")


@main.command()
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--open", "open_report", is_flag=True,
              help="Also open the folder's report.html (overview, graph, stage code, plan) in a web browser.")
def inspect(out_dir: Path, as_json: bool, open_report: bool) -> None:
    """Print the summary of a folder written by transform (stages, balance, collectives, memory per rank);
    --open also shows its report.html."""
    from .artifacts import read_plan_record
    from .summary import render

    try:
        report = _report_path(out_dir) if open_report else None
        record = read_plan_record(out_dir)
    except GraphsplitError as exc:
        _fail(exc)
        return
    summary = record.get("summary")
    if summary is None:
        _fail(GraphsplitError(f"{out_dir}/plan.json has no summary; re-run graphsplit transform"))
        return
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
    else:
        click.echo(f"{record['model']['path']}:{record['model']['factory']} (graphsplit {record['graphsplit_version']}, "
                   f"torch {record['torch_version']})")
        render(summary)
    if report is not None:
        _open_report(report)


def _report_path(out_dir: Path) -> Path:
    from .artifacts import REPORT_FILE

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


@main.command()
@click.argument("model")
@click.option("--gpus", type=int, required=True, help="Devices available in all.")
@click.option("--gpu-memory", "gpu_memory", required=True, help="Memory of one device, e.g. 80GiB.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes the devices are spread over (tp stays in a node).")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
def advise(model: str, gpus: int, gpu_memory: str, nodes: int, as_json: bool) -> None:
    """How much memory training MODEL takes, and which plan fits GPUS devices of GPU_MEMORY."""
    from .advise import advise as do_advise
    from .advise import parse_bytes
    from .loader import load_model
    from .summary import _fmt_bytes

    try:
        if gpus < 1 or nodes < 1 or gpus % nodes:
            raise GraphsplitError(f"--gpus {gpus} must be a positive multiple of --nodes {nodes}")
        result = do_advise(load_model(model), gpus, parse_bytes(gpu_memory), gpus // nodes)
    except GraphsplitError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    parts = ("parameters", "gradients", "optimizer_state", "activations", "outputs_and_loss", "total")

    def line(est: dict) -> str:
        p = est["plan"]
        return f"tp={p['tp']} pp={p['pp']} dp={p['dp']}: " + ", ".join(f"{k.replace('_', ' ')} {_fmt_bytes(est[k])}" for k in parts)

    click.echo(f"scenario: {result['scenario']}")
    click.echo(f"on one device: {line(result['single_device'])}")
    if result["fits"]:
        click.echo(f"recommended (per rank): {line(result['recommended'])}")
        for alt in result["alternatives"]:
            click.echo(f"  also fits: {line(alt)}")
    else:
        click.echo(f"nothing fits {gpus} x {gpu_memory}; closest: {line(result['closest'])}")
        click.echo(f"it would take about {result['devices_needed']} devices")


@main.command()
@click.argument("target")
@_plan_options
@click.option("--steps", type=int, default=5, show_default=True, help="Training steps.")
@click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default="sgd", show_default=True)
@click.option("--lr", type=float, default=0.01, show_default=True)
@click.option("--check", is_flag=True, help="Also train the untouched model and compare loss, outputs and gradients.")
@click.option("--weights", "weights", type=click.Path(), default=None,
              help="A .safetensors file or torch state dict; each rank reads only its own shards.")
@click.option("--save", "save", type=click.Path(), default=None,
              help="Write a checkpoint folder (torch.distributed.checkpoint, original parameter names) after the last step.")
@click.option("--resume", "resume", type=click.Path(), default=None,
              help="Start from a checkpoint folder written by --save at any plan; --steps more steps are run.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True, help="Seconds before the run is stopped.")
def run(target: str, steps: int, optimizer: str, lr: float, check: bool, timeout_s: float, weights: str | None,
        save: str | None, resume: str | None, **kwargs: Any) -> None:
    """Train TARGET (a model file, or a folder written by transform) under torchrun on this machine."""
    from .artifacts import model_spec_from_record, read_plan_record
    from .launch import RunOptions, run_training

    try:
        plan, flags_given = _plan_from(kwargs)
        fixed_cuts = None
        model_spec = target
        if Path(target).is_dir():
            if flags_given:
                raise GraphsplitError(f"{target} is a transformed folder with its own plan; drop the plan flags or run the model file")
            record = read_plan_record(Path(target))
            plan = Plan.from_dict(record["plan"])
            fixed_cuts = tuple(record["split"]["stage_starts"])
            model_spec = model_spec_from_record(record, Path(target))
        opts = RunOptions(steps=steps, optimizer=optimizer, lr=lr, check=check, timeout_s=timeout_s, weights=weights,
                          save=save, resume=resume)
        cmp = run_training(model_spec, plan, opts, fixed_cuts, echo=click.echo)
    except GraphsplitError as exc:
        _fail(exc)
        return
    if cmp is not None and not cmp.ok:
        sys.exit(1)


@main.command("export-weights")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
def export_weights(checkpoint: Path, out: Path) -> None:
    """Write CHECKPOINT (a folder from run --save, any plan) as one .safetensors file the untouched model loads."""
    from .dcp import export_weights as do_export

    try:
        names = do_export(checkpoint, out)
    except GraphsplitError as exc:
        _fail(exc)
        return
    click.echo(f"wrote {out}: {len(names)} tensors")


if __name__ == "__main__":
    main()
