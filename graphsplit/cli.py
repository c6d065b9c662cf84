"""The `graphsplit` command line (click).

Every failure ends as one line on stderr, `error: <what is wrong and what to do>`:

- exit 2: bad input. A `GraphsplitError` raised where the problem is found (the
  loader, the Plan, a pass, the weights reader...), a bad flag or value (click's
  usage errors, folded into one line), or a file-system error naming its path.
- exit 3: an internal error, graphsplit's own bug: the line says so and how to
  report it. `graphsplit --debug ...` (or GRAPHSPLIT_DEBUG=1) prints the
  traceback after the line, for every error.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from .cli_errors import DEBUG_ENV, debug_enabled, fail, internal, set_debug
from .cli_inspect import inspect
from .cli_options import parse_betas, plan_from, plan_options, positive
from .errors import GraphsplitError
from .launch.supervise import DEFAULT_COLLECTIVE_TIMEOUT_S
from .plan import Plan
from .runtime.schedule import LR_SCHEDULES


class _Main(click.Group):
    """The `graphsplit` group: click's usage errors and anything a command let through, as one line."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        set_debug(False)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:  # bare `graphsplit`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:  # click's usage, hint and error lines, as one line
            where = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            click.echo(f"error: {' '.join(exc.format_message().split())}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except GraphsplitError as exc:  # raised outside a command's own handler (a click callback)
            fail(exc)
        except OSError as exc:  # the file system said no: the path tells the user what to look at
            click.echo(f"error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}; check that path "
                       "(graphsplit --debug ... prints where it happened)", err=True)
            if debug_enabled():
                traceback.print_exception(exc, file=sys.stderr)
            sys.exit(2)
        except Exception as exc:
            internal(exc)
        sys.exit(rv if isinstance(rv, int) else 0)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    set_debug(value, keep=True)  # read by fail/internal, after the command's context is gone


@click.group(cls=_Main)
@click.version_option(package_name="graphsplit")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
              help=f"Print the traceback after an error's one line (also {DEBUG_ENV}=1).")
def main() -> None:
    """Turn an ordinary PyTorch model into a pipeline / tensor / data-parallel training program."""


main.add_command(inspect)


@main.command()
@click.argument("model")
@plan_options
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None, help="Folder for plan.json and stage code.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout (logs go to stderr).")
@click.option("--device-map", "device_map_file", type=click.Path(path_type=Path), default=None,
              help="Also write a device map (module -> device index, one device per pipeline stage) for "
                   "accelerate.dispatch_model or from_pretrained(device_map=...): one process, layers on several devices.")
def transform(model: str, out_dir: Path | None, as_json: bool, device_map_file: Path | None, **kwargs: Any) -> None:
    """Plan and rewrite MODEL (path/to/model.py[:factory]); write artifacts to --out."""
    from .api import transform as do_transform
    from .loader import load_model
    from .report.summary import render

    try:
        plan, _ = plan_from(kwargs)
        if device_map_file is not None:
            from .report.device_map import check_device_map_target

            check_device_map_target(device_map_file, plan)
        loaded = load_model(model, plan.seed)
        result = do_transform(loaded, plan, out_dir)
        if device_map_file is not None:
            from .report.device_map import write_device_map

            write_device_map(device_map_file, result.program, loaded.build("meta"))
    except GraphsplitError as exc:
        fail(exc)
        return
    if device_map_file is not None:
        click.echo(f"wrote {device_map_file}", err=True)
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))
        if out_dir is not None:
            click.echo(f"wrote {out_dir}", err=True)
    else:
        render(result.summary)
        if out_dir is not None:
            click.echo(f"wrote {out_dir}/plan.json and {len(result.program.stages)} stage files")


@main.command()
@click.argument("model")
@click.option("--gpus", type=int, required=True, help="Devices available in all.")
@click.option("--gpu-memory", "gpu_memory", required=True, help="Memory of one device, e.g. 80GiB.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes the devices are spread over (tp stays in a node).")
@click.option("--hardware", default="h100", show_default=True,
              help="h100, h200, a100, cpu or a profile JSON file: ranks the plans that fit.")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
def advise(model: str, gpus: int, gpu_memory: str, nodes: int, hardware: str, as_json: bool) -> None:
    """How much memory training MODEL takes, and which plan fits GPUS devices of GPU_MEMORY."""
    from .loader import load_model
    from .planner import load_hardware
    from .report.advise import advise as do_advise
    from .report.advise import parse_bytes, render

    try:
        if gpus < 1:
            raise GraphsplitError(f"--gpus must be at least 1, got {gpus}")
        if nodes < 1:
            raise GraphsplitError(f"--nodes must be at least 1, got {nodes}")
        if gpus % nodes:
            fits = [n for n in range(1, gpus + 1) if gpus % n == 0]
            raise GraphsplitError(f"--gpus {gpus} cannot be spread evenly over --nodes {nodes}; "
                                  f"use --nodes {', '.join(map(str, fits))} (or a multiple of {nodes} GPUs)")
        memory = parse_bytes(gpu_memory)  # before the model loads: a typo fails at once
        hw = load_hardware(hardware)
        result = do_advise(load_model(model), gpus, memory, gpus // nodes, hw)
    except GraphsplitError as exc:
        fail(exc)
        return
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        render(result, gpus, gpu_memory, click.echo)


@main.command("plan")
@click.argument("model")
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="Devices available in all.")
@click.option("--gpu-memory", "gpu_memory", default=None,
              help="Memory of one device, e.g. 80GiB (default: the hardware profile's).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="Devices per node: tp stays inside one (default: the hardware profile's).")
@click.option("--hardware", default="h100", show_default=True,
              help="h100, h200, a100, cpu (this machine, measured) or a profile JSON file.")
@click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True)
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Plans to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Write the best plan (and its prediction) here, for transform/run --plan and Plan.load.")
@plan_options
def plan_command(model: str, gpus: int, gpu_memory: str | None, gpus_per_node: int | None, hardware: str,
                 optimizer: str, top: int, as_json: bool, out: Path | None, **plan_flags: Any) -> None:
    """Which plan to run: search tp, pp, dp, DDP or FSDP, micro-batches, schedule, checkpointing and
    precision for GPUS devices, and rank the plans that fit by predicted step time. Given plan flags
    (--tp 8 --pp 16 ...) or --plan FILE: price exactly that plan, fits or not, beside the search's best."""
    from .loader import load_model
    from .planner import load_hardware, plan_model
    from .report.advise import parse_bytes
    from .report.planning import price_command, render, write_plan_file

    try:
        hw = load_hardware(hardware)
        memory = parse_bytes(gpu_memory) if gpu_memory is not None else hw.memory_bytes
        given, priced = plan_from(plan_flags, devices=gpus)
        if priced:
            if out is not None:
                raise GraphsplitError("--out writes the search's best plan; drop it when pricing a given plan")
            price_command(load_model(model), given, gpus, memory, gpus_per_node, hw, optimizer, as_json)
            return
        loaded = load_model(model)
        result, profile = plan_model(loaded, gpus, memory, hw, gpus_per_node, optimizer)
        context = {"model": str(loaded.path), "gpus": gpus, "gpu_memory": memory, "hardware": hw.name}
        if out is not None and result.fits:
            write_plan_file(out, result, context)
    except GraphsplitError as exc:
        fail(exc)
        return
    if as_json:
        click.echo(json.dumps({**context, "batch": profile.batch, **result.to_dict(top)}, indent=2))
    else:
        render(result, f"{loaded.path.name}: {gpus} x {hw.name}, {memory / 2**30:.1f} GiB each; global batch "
                       f"{profile.batch}" + (f" x {profile.tokens_per_sample} tokens" if profile.tokens_per_sample else ""),
               top)
    if out is not None:
        if not result.fits:
            click.echo(f"error: no plan fits, so nothing was written to {out}", err=True)
            sys.exit(1)
        click.echo(f"wrote {out}", err=True)


@main.command()
@click.argument("target")
@plan_options
@click.option("--steps", type=int, default=5, show_default=True, help="Training steps.")
@click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default="sgd", show_default=True)
@click.option("--lr", type=float, default=0.01, show_default=True, callback=positive("--lr", allow_zero=True))
@click.option("--weight-decay", "weight_decay", type=float, default=None, callback=positive("--weight-decay", allow_zero=True),
              help="Weight decay (default: torch's, 0.01 for adamw, 0 for sgd).")
@click.option("--betas", default=None, metavar="B1,B2", help="AdamW's betas, e.g. 0.9,0.95 (default 0.9,0.999).")
@click.option("--lr-schedule", "lr_schedule", type=click.Choice(list(LR_SCHEDULES)), default="constant", show_default=True,
              help="The lr over the run: cosine and linear decay towards 0 by the last step, after the warm-up.")
@click.option("--warmup-steps", "warmup_steps", type=int, default=0, show_default=True,
              help="Steps of linear warm-up at the start of the lr schedule.")
@click.option("--grad-clip", "grad_clip", type=float, default=None, callback=positive("--grad-clip"), metavar="MAX_NORM",
              help="Clip the global gradient norm (over every parameter once: tp shards, stages, dp shards) to MAX_NORM.")
@click.option("--eval-every", "eval_every", type=int, default=0, show_default=True,
              help="Every K steps, the mean loss over the model file's eval_data(), forward only (0: never).")
@click.option("--metrics", "metrics", type=click.Path(), default=None,
              help="Write one JSON line per step here: step, loss, lr, grad_norm, throughput, step_seconds, memory "
                   "(graphsplit inspect FILE plots them).")
@click.option("--tensorboard", "tensorboard", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Also write those numbers as TensorBoard scalars into DIR (tensorboard --logdir DIR); "
                   "needs pip install 'graphsplit[tensorboard]'.")
@click.option("--nnodes", type=int, default=1, show_default=True, help="Machines taking part (torchrun's --nnodes).")
@click.option("--node-rank", "node_rank", type=int, default=0, show_default=True, help="This machine's rank, 0..nnodes-1.")
@click.option("--rdzv-endpoint", "rdzv_endpoint", default=None, metavar="HOST:PORT",
              help="Node 0's address and a free port, where the nodes meet (needed with --nnodes > 1).")
@click.option("--nproc-per-node", "nproc_per_node", type=int, default=None,
              help="Processes on this machine (default: the plan's world size / --nnodes).")
@click.option("--print-command", "print_command", is_flag=True,
              help="Print the torchrun command line (its spec file kept) and exit without training.")
@click.option("--check", is_flag=True, help="Also train the untouched model and compare loss, outputs and gradients.")
@click.option("--init", "init", type=click.Choice(["auto", "exact", "fast"]), default="auto", show_default=True,
              help="Without --weights: exact runs the model's constructor on every rank (its values to the bit); "
                   "fast draws only each rank's blocks, the same values at every plan; auto: exact with --check "
                   "or below 500M parameters, fast above.")
@click.option("--weights", "weights", type=click.Path(), default=None,
              help="A .safetensors file or torch state dict; each rank reads only its own shards.")
@click.option("--save", "save", type=click.Path(), default=None,
              help="Write checkpoints (torch.distributed.checkpoint, original parameter names) into this folder, "
                   "one step-<N> folder each: after the last step, and every --save-every steps.")
@click.option("--save-every", "save_every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also checkpoint every K steps (0: only after the last), so a crash loses at most K steps.")
@click.option("--keep-last", "keep_last", type=click.IntRange(min=0), default=3, show_default=True,
              help="Keep the newest N checkpoints in the --save folder (0: keep all).")
@click.option("--resume", "resume", type=click.Path(), default=None,
              help="Start from a checkpoint written at any plan: a step-<N> folder, or a --save folder "
                   "(its newest complete checkpoint); --steps more steps are run.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True, callback=positive("--timeout"),
              help="Seconds before the run is stopped (every rank, whatever it is doing).")
@click.option("--collective-timeout", "collective_timeout_s", type=float, default=DEFAULT_COLLECTIVE_TIMEOUT_S, show_default=True,
              callback=positive("--collective-timeout"),
              help="Seconds a rank may wait for another in one collective once set-up is over; a rank that "
                   "stops answering is then named and every rank stopped.")
def run(target: str, steps: int, optimizer: str, lr: float, check: bool, timeout_s: float, weights: str | None,
        save: str | None, resume: str | None, collective_timeout_s: float, save_every: int, keep_last: int,
        weight_decay: float | None, betas: str | None, lr_schedule: str, warmup_steps: int, grad_clip: float | None,
        eval_every: int, metrics: str | None, tensorboard: str | None, nnodes: int, node_rank: int, rdzv_endpoint: str | None,
        nproc_per_node: int | None, print_command: bool, init: str, **kwargs: Any) -> None:
    """Train TARGET (a model file, or a folder written by transform) under torchrun, on this machine or
    with --nnodes on several; batches from the file's train_data() when it defines one."""
    from .launch.launcher import Nodes, RunOptions, run_training
    from .report.artifacts import model_spec_from_record, read_plan_record

    try:
        plan, flags_given = plan_from(kwargs)
        fixed_cuts = None
        model_spec = target
        if Path(target).is_dir():
            if flags_given:
                raise GraphsplitError(f"{target} is a transformed folder with its own plan; drop the plan flags or run the model file")
            record = read_plan_record(Path(target))
            plan = Plan.from_dict(record["plan"])
            fixed_cuts = tuple(record["split"]["stage_starts"])
            model_spec = model_spec_from_record(record, Path(target))
        optim = {"weight_decay": weight_decay, "betas": parse_betas(betas), "lr_schedule": lr_schedule,
                 "warmup_steps": warmup_steps, "grad_clip": grad_clip}
        nodes = None
        if nnodes != 1 or rdzv_endpoint is not None or node_rank != 0 or nproc_per_node is not None:
            if nnodes > 1 and rdzv_endpoint is None:
                raise GraphsplitError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT, node 0's address and a free port")
            per_node = nproc_per_node if nproc_per_node is not None else plan.world_size // max(nnodes, 1)
            nodes = Nodes(nnodes, node_rank, rdzv_endpoint or "", per_node)
        opts = RunOptions(steps=steps, optimizer=optimizer, lr=lr, optim=optim, check=check, timeout_s=timeout_s,
                          weights=weights, save=save, resume=resume, collective_timeout_s=collective_timeout_s,
                          save_every=save_every, keep_last=keep_last, eval_every=eval_every, metrics=metrics,
                          tensorboard=tensorboard, nodes=nodes, print_command=print_command, init=init)
        cmp = run_training(model_spec, plan, opts, fixed_cuts, echo=click.echo)
    except GraphsplitError as exc:
        fail(exc)
        return
    if cmp is not None and not cmp.ok:
        sys.exit(1)


@main.command("export-weights")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
def export_weights(checkpoint: Path, out: Path) -> None:
    """Write CHECKPOINT (a checkpoint from run --save at any plan, or a --save folder: its newest) as one
    .safetensors file the untouched model loads."""
    from .runtime.dcp.series import resolve_checkpoint
    from .runtime.dcp.state import export_weights as do_export

    try:
        source = resolve_checkpoint(checkpoint)
        names = do_export(source, out)
    except GraphsplitError as exc:
        fail(exc)
        return
    click.echo(f"wrote {out}: {len(names)} tensors from {source}")


def console() -> None:
    """The `graphsplit` console command: `main`, then the process ends without the collector walking
    every object the command made on its way out (a deep model's planner leaves millions: a second of
    the command's time). In-process callers (tests, scripts) use `main`."""
    import gc

    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()

