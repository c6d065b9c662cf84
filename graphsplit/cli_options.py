"""The command line's shared options and their parsing: the plan flags every plan-taking command has
(`transform`, `run`, `plan`), and the values click cannot check alone."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .errors import GraphsplitError
from .plan import MULTI_STAGE_SCHEDULES, SCHEDULES, Plan


def plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--pp", type=int, default=None, help="Pipeline-parallel ranks."),
        click.option("--tp", type=int, default=None, help="Tensor-parallel ranks (Megatron-style plan found from the graph)."),
        click.option("--sequence-parallel", "sequence_parallel", is_flag=True, default=None,
                     help="Megatron's sequence parallelism with --tp: norms, dropout and residual adds run on "
                          "1/tp of the sequence (reduce-scatter + all-gather instead of all-reduce)."),
        click.option("--async-tp", "async_tp", is_flag=True, default=None,
                     help="Sequence parallelism (implied) with its all-gathers and reduce-scatters run as rings "
                          "of point-to-point steps, each overlapping the matmul of a chunk already held "
                          "(torchtitan's async TP)."),
        click.option("--dp", type=int, default=None, help="Data-parallel replicas (gradients averaged over them)."),
        click.option("--ep", type=int, default=None,
                     help="Expert-parallel ranks, drawn from --dp (default --dp = --ep): each mixture-of-experts "
                          "layer's experts placed whole on them, tokens exchanged by all-to-alls."),
        click.option("--cp", type=int, default=None,
                     help="Context-parallel ranks, drawn from --dp (default --dp = --cp): each sample's sequence "
                          "cut across them (load-balanced), keys and values gathered at every attention call."),
        click.option("--fsdp", is_flag=True, default=None,
                     help="Shard parameters, gradients and optimizer state over the dp replicas (FSDP2, ZeRO-3)."),
        click.option("--zero", type=click.IntRange(1, 3), default=None,
                     help="DeepSpeed's stage over the dp replicas: 1 shards the optimizer states alone (DDP, "
                          "ZeroRedundancyOptimizer); 2 and 3 shard with FSDP2 (imply --fsdp): 3 (--fsdp's default) "
                          "frees each block's gathered parameters after its forward, 2 keeps them gathered to the "
                          "end of the backward (one all-gather a step, more memory)."),
        click.option("--sync-bn", "sync_bn", is_flag=True, default=None,
                     help="BatchNorm statistics over all dp replicas (one all-reduce per layer), not per replica."),
        click.option("--microbatches", type=int, default=None, help="Micro-batches per step (default: number of stages)."),
        click.option("--schedule", type=click.Choice(list(SCHEDULES)), default=None, help="Pipeline schedule (default 1f1b); the interleaved ones (interleaved-1f1b, looped-bfs, zero-bubble, zbv, dualpipev) default to 2 stages per rank."),
        click.option("--stages-per-rank", type=int, default=None, help="Virtual stages per pp rank (interleaved schedules)."),
        click.option("--split-at", default=None, help="Comma-separated module names that start a new stage, e.g. h.6,h.12."),
        click.option("--seed", type=int, default=None, help="Seed for the model's initialization (default 0)."),
        click.option("--checkpoint", default=None,
                     help="Activation checkpointing (default none): blocks recomputes each repeated block "
                          "(h.3, layers.7) and the ops after it in its stage (final norm, LM head); "
                          "every:K, K blocks per region; first:N, only the first N blocks of each stage; "
                          "stage, each whole stage; selective, each block "
                          "keeps its matmul/attention outputs and recomputes the cheap ops; selective:K keeps "
                          "one matmul output in K (selective:2: torchtitan's op-level policy); attention, only "
                          "written-out attention's softmax(q @ k^T) @ v (Megatron's selective recompute)."),
        click.option("--checkpoint-module", "checkpoint_overrides", multiple=True, metavar="GLOB=POLICY",
                     help="Per-module override, repeatable: modules whose name matches GLOB (h.0, h.1*, "
                          "h.*.mlp) are none (not checkpointed), full (one recomputed region) or "
                          "selective; the last matching one wins, e.g. --checkpoint-module 'h.0=none'."),
        click.option("--autocast", type=click.Choice(["bf16", "fp16"]), default=None,
                     help="Mixed precision: matmuls in this dtype, parameters, norms and the loss in fp32."),
        click.option("--fp8", type=click.Choice(["tensorwise", "rowwise"]), default=None,
                     help="Linears in float8 with torchao's recipe (pip install torchao), scales agreed across tp shards."),
        click.option("--compile", "compile", is_flag=True, default=None,
                     help="Run each stage under torch.compile (inductor); tp collectives stay eager, between compiled pieces."),
        click.option("--send-flops-per-byte", "send_flops_per_byte", type=float, default=None,
                     help="What a byte sent to the next pipeline stage weighs in the balanced cut, in FLOPs "
                          "(default 8); graphsplit plan sets it from the hardware: its matmul rate over the pp "
                          "link's bandwidth (about 2,000 on H100s over NVLink, 20,000 across nodes)."),
        click.option("--plan", "plan_file", type=click.Path(path_type=Path), default=None,
                     help="A plan file (what graphsplit plan --out writes) instead of the flags above."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


_PLAN_KEYS = ("pp", "tp", "sequence_parallel", "async_tp", "dp", "ep", "cp", "fsdp", "zero", "sync_bn", "microbatches", "schedule", "stages_per_rank",
              "split_at", "seed", "checkpoint", "checkpoint_overrides", "autocast", "fp8", "compile",
              "send_flops_per_byte")


def plan_from(kwargs: dict[str, Any], devices: int | None = None) -> tuple[Plan, bool]:
    """The plan the flags (or --plan) give, and whether any was given; `devices`: dp, where not
    given, is what they leave after tp and pp (`graphsplit plan --gpus 64 --tp 8 --pp 2` is dp 4)."""
    plan_file = kwargs.pop("plan_file", None)
    given = {k: kwargs.pop(k, None) for k in _PLAN_KEYS}
    given = {k: v for k, v in given.items() if v is not None and v != ()}
    shape = given.get("tp", 1) * given.get("pp", 1)
    if devices is not None and given and "dp" not in given and devices % shape == 0:
        given["dp"] = devices // shape
    if plan_file is not None:
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise GraphsplitError(f"--plan {plan_file} is a whole plan; drop {flags} or drop --plan")
        return Plan.load(plan_file), True
    if given.get("zero", 1) > 1:
        given["fsdp"] = True
    if given.get("async_tp"):
        given["sequence_parallel"] = True
    if "checkpoint_overrides" in given:
        given["checkpoint_overrides"] = tuple(_override(text) for text in given["checkpoint_overrides"])
    if "split_at" in given:
        given["split_at"] = _split_points(given["split_at"])
    if "dp" not in given and max(given.get("ep", 1), given.get("cp", 1)) > 1:  # ep and cp ranks are dp ones
        given["dp"] = max(given.get("ep", 1), given.get("cp", 1))
    if given.get("schedule") in MULTI_STAGE_SCHEDULES and "stages_per_rank" not in given:
        given["stages_per_rank"] = 2
    return Plan(**given), bool(given)


def _split_points(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(","))
    if not all(names):
        raise GraphsplitError(f"--split-at {text!r} has an empty name; give comma-separated module names "
                              "that start a new stage, e.g. --split-at h.6,h.12")
    return names


def positive(name: str, allow_zero: bool = False) -> Callable[[click.Context, click.Parameter, float], float]:
    """A click callback refusing a non-positive (or negative) or non-finite number."""
    def check(ctx: click.Context, param: click.Parameter, value: float) -> float:
        if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)):
            raise GraphsplitError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value:g}")
        return value
    return check


def parse_betas(text: str | None) -> tuple[float, float] | None:
    """--betas 0.9,0.95 -> (0.9, 0.95)."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 2:
        raise GraphsplitError(f"--betas takes two numbers, B1,B2 (e.g. 0.9,0.95), got {text!r}")
    return values  # type: ignore[return-value]


def _override(text: str) -> tuple[str, str]:
    glob, sep, policy = text.rpartition("=")
    if not sep or not glob.strip():
        raise GraphsplitError(f"--checkpoint-module takes GLOB=POLICY (e.g. 'h.0=none'), got {text!r}")
    return glob.strip(), policy.strip()
