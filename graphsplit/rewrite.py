"""Model + inputs + Plan -> Program: trace, analyze, run the passes, cut.

The passes, in the order they run (each in graphsplit/passes/):

- grad_mode.py: ops the model ran under no_grad / inference_mode get detached
  inputs, so the program trains exactly what the model trains;
- token_mean.py: means over counted tokens (cross-entropy with ignore_index, masked means)
  become sums times a per-step factor: normalized by the whole global batch's count;
- sync_batch_norm.py: with --sync-bn, BatchNorm statistics over the dp replicas;
- expert_parallel.py: with --ep, whole experts per rank, tokens exchanged by all-to-alls;
- tensor_parallel/: shard linears and embeddings, insert the tp collectives;
- vocab_parallel_loss.py: keep vocab-sharded logits sharded into a cross-entropy;
- float8.py: with --fp8, the linears in float8 (torchao's recipes), scales agreed across tp shards;
- autocast.py: matmuls in bf16 / fp16, norms, softmax and the loss in fp32;
- float8_gather.py: with --fp8 tensorwise and --sequence-parallel, the tokens the float8 column
  linears read cast once on the shard and gathered in float8;
- async_tp.py: with --async-tp, sequence parallelism's collectives as rings beside their matmuls;
- context_parallel.py: with --cp, each rank's shard of the sequence; keys and values gathered at
  every attention call, positions made global;
- pipeline_split.py: assign every node to a pipeline stage;
- activation_checkpoint.py: wrap regions of each stage in activation checkpointing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .analysis.loss_reduction import TokenMeans
from .analysis.shapes import annotate
from .errors import GraphsplitError
from .front_end import check_call, find_batch, front_end
from .ir.batch import BatchDims, SequenceDims
from .ir.program import Program
from .ir.trace import trace_model
from .ir.traced_model import Traced
from .ops.context_parallel import shard_tree, shard_values
from .passes.activation_checkpoint import checkpoint_pass
from .passes.async_tp import async_tp_pass
from .passes.attention_form import attention_form
from .passes.autocast import autocast_pass
from .passes.bag_offsets import own_bag_offsets
from .passes.context_parallel import (
    check_masks,
    check_sequence_mixers,
    context_parallel_pass,
    cut_positions,
)
from .passes.expert_parallel import ExpertParallelResult, expert_parallel_pass
from .passes.float8 import Float8Result, float8_pass
from .passes.float8_gather import float8_gather_pass
from .passes.grad_mode import grad_mode_pass
from .passes.manager import LossInput, Pass, PassInput, run_passes
from .passes.pipeline_split import cut_places, pipeline_split_pass, too_few_cuts
from .passes.replica_gather import gather_before_tail
from .passes.stage_programs import build_program
from .passes.sync_batch_norm import sync_batch_norm_pass
from .passes.tensor_parallel import TensorParallelResult, tensor_parallel_pass
from .passes.token_mean import token_mean_pass
from .passes.vocab_parallel_loss import VocabParallelLoss, vocab_parallel_loss_pass
from .plan import Plan, divisors
from .runtime.microbatch import split_microbatches

PASSES: tuple[tuple[str, Pass], ...] = (
    ("grad_mode", grad_mode_pass),
    ("token_mean", token_mean_pass),
    ("sync_batch_norm", sync_batch_norm_pass),
    ("expert_parallel", expert_parallel_pass),
    ("tensor_parallel", tensor_parallel_pass),
    ("vocab_parallel_loss", vocab_parallel_loss_pass),
    ("float8", float8_pass),
    ("autocast", autocast_pass),
    ("float8_gather", float8_gather_pass),
    ("async_tp", async_tp_pass),
    ("context_parallel", context_parallel_pass),
    ("pipeline_split", pipeline_split_pass),
    ("checkpoint", checkpoint_pass),
)
# Groups of PASSES by what they are for. "cost": what changes what an op costs (the planner's tables are
# these passes' graph, at each tp degree; autocast it runs on a copy, for the low-precision table).
PASS_GROUPS: dict[str, tuple[str, ...]] = {"cost": ("grad_mode", "tensor_parallel", "vocab_parallel_loss")}


def pass_group(name: str) -> list[tuple[str, Pass]]:
    """The passes of group `name`, in the compiler's order."""
    return [p for p in PASSES if p[0] in PASS_GROUPS[name]]


def _divisors(n: int) -> str:
    return ", ".join(map(str, divisors(n)))


def first_microbatch(traced: Traced, flat: tuple[Any, ...], plan: Plan, replicas: int,
                     batch: BatchDims | None = None) -> tuple[Any, ...]:
    """One micro-batch of the inputs (each of `replicas` data-parallel replicas takes its share of
    the batch, then cuts it into the plan's micro-batches); the refusal names which factor does not fit."""
    n = plan.num_microbatches
    batch = batch or BatchDims.leading(traced.input_names, flat)
    dims = batch.input_dims(traced.input_names)
    if not batch.batched:
        if replicas * n > 1:
            why = batch.notes[-1] if batch.notes else "no input carries a batch"
            raise GraphsplitError(
                f"the inputs cannot be cut into {replicas} replica(s) x {n} micro-batch(es): {why}; so the whole "
                "batch is one piece here: run with --dp 1 --microbatches 1, or give batch_dims() in the model file "
                "if a dim does hold independent examples")
        return tuple(flat)
    for name, t, dim in zip(traced.input_names, flat, dims):
        if not isinstance(t, torch.Tensor) or dim is None:
            continue
        if t.dim() <= dim:
            raise GraphsplitError(f"input {name!r} of shape {tuple(t.shape)} has no dim {dim} to hold the batch")
        size = t.shape[dim]
        shape = tuple(t.shape)
        along = f"along dim {dim} (the batch dim)"
        if size == 0:
            raise GraphsplitError(f"input {name!r} of shape {shape} is an empty batch; example_inputs() must give "
                                  f"at least {replicas * n} example(s) {along}")
        if size % replicas:
            raise GraphsplitError(
                f"the batch of {size} (input {name!r} of shape {shape}, {along}) cannot be shared equally by "
                f"{replicas} data-parallel replicas; use a --dp that divides {size} ({_divisors(size)}) or a batch "
                f"divisible by {replicas}"
            )
        share = size // replicas
        if share % n:
            whose = f"each replica's share ({share} of {size})" if replicas > 1 else f"the batch of {size}"
            if plan.microbatches is None:
                if plan.num_stages > 1:
                    _require_cut_places(traced, flat, plan)  # too many stages is the problem to report first
                why = f"by default one per pipeline stage, {n}"
            else:
                why = f"--microbatches {n}"
            raise GraphsplitError(
                f"{whose} (input {name!r} of shape {shape}, {along}) cannot be cut into equal micro-batches ({why}); "
                f"give --microbatches dividing {share} ({_divisors(share)}) or a batch divisible by {n * replicas}"
            )
    return tuple(split_microbatches(tuple(flat), replicas * n, dims)[0])


def require_sequence(traced: Traced, flat: tuple[Any, ...], plan: Plan, batch: BatchDims) -> SequenceDims:
    """--cp: the sequence the plan cuts, checked: attention calls alone mix it (once causal masks built
    from sizes are attention's own `is_causal`), every value holding it holds it as a dim of its own,
    and it divides into 2 x cp equal chunks (the load-balanced cut). Then the values built from a
    position are made this rank's (`cut_positions`): the graph has the shard's shapes."""
    seq = batch.sequence
    if seq is None:
        raise GraphsplitError(f"--cp {plan.cp}: no input has a dim that an F.scaled_dot_product_attention call "
                              "mixes (attention written out as matmul and softmax is not cut; HF models take "
                              "attn_implementation='sdpa'), so there is no sequence to cut; drop --cp")
    check_masks(traced.gm)
    check_sequence_mixers(traced.gm, seq.mixers)
    if seq.unmatched:
        what, why = seq.unmatched[0]
        raise GraphsplitError(f"--cp {plan.cp}: {what} holds {seq.length} tokens but not as the sequence attention mixes "
                              f"({why}), so it would not be cut with it (HF's labels=, padded and shifted inside the "
                              "model, are: give shifted targets to loss_fn); drop --cp")
    if seq.merged:
        raise GraphsplitError(f"--cp {plan.cp}: {seq.merged[0]} holds the sequence merged with another dim; context "
                              "parallelism cuts values that hold it as a dim of its own; drop --cp")
    if seq.length % (2 * plan.cp):
        where = next((f"input {n!r} dim {d}" for n, d in seq.inputs.items() if d is not None), "the inputs")
        fits = [c for c in divisors(seq.length // 2) if c > 1] if seq.length % 2 == 0 else []
        raise GraphsplitError(
            f"--cp {plan.cp}: the sequence of {seq.length} tokens ({where}) cannot be cut into {2 * plan.cp} equal "
            f"chunks (two per rank, balanced for causal attention); give a sequence length divisible by {2 * plan.cp}"
            + (f", or --cp {', '.join(map(str, fits))}" if fits else ""))
    cut_positions(traced.gm, plan.cp, seq.length)
    return seq


def _require_cut_places(traced: Traced, flat: tuple[Any, ...], plan: Plan) -> None:
    """Analyze at the whole batch, only to count where the model can be cut (an error path)."""
    annotate(traced.gm, tuple(torch.as_tensor(t) for t in flat))
    places, operations = cut_places(traced.gm)
    if places < plan.num_stages - 1:
        raise too_few_cuts(plan.num_stages, plan.stages_per_rank, places, operations)


def _whole_loss_plan(plan: Plan, why: str) -> Plan:
    """The plan for a loss that couples the samples (a contrastive loss: `why`): each replica's share is one
    micro-batch, and the loss runs once on the replicas' outputs gathered (runtime/whole_batch.py)."""
    said = f"the loss couples the samples ({why})"
    if plan.microbatches not in (None, 1):
        raise GraphsplitError(f"--microbatches {plan.microbatches}: {said}, so each replica's share runs as one "
                              "micro-batch; drop --microbatches")
    for flag, n, what in (("--cp", plan.cp, "cuts each sample's sequence"), ("--ep", plan.ep, "exchanges tokens")):
        if n > 1:
            raise GraphsplitError(f"{flag} {n}: {said}, and graphsplit gathers the replicas' outputs for it only "
                                  f"over plain data parallelism, which {flag} {what} beside; drop {flag}")
    return plan.replace(microbatches=1, schedule="gpipe" if plan.schedule == "1f1b" and plan.pp > 1 else plan.schedule)


def require_supported(plan: Plan) -> None:
    """Refuse, clearly, plans that cannot run."""
    if plan.fsdp and plan.dp < 2:
        raise GraphsplitError(f"--fsdp shards parameters over the data-parallel replicas but dp={plan.dp}; "
                              "give --dp 2 or more")
    if plan.sync_bn and plan.dp < 2:
        raise GraphsplitError(f"--sync-bn shares BatchNorm statistics across data-parallel replicas but dp={plan.dp}; "
                              "give --dp 2 or more")


@dataclass
class RewriteResult:
    program: Program
    timings: dict[str, float]


def rewrite_program(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    plan: Plan,
    source: Path | None = None,
    fixed_cuts: tuple[str, ...] | None = None,
    loss_fn: Any = None,
    target: Any = None,
    global_batch: bool = True,
    traced: Traced | None = None,
    declared_batch: dict[str, int | None] | None = None,
    buffers: Callable[[], Mapping[str, torch.Tensor]] | None = None,
) -> RewriteResult:
    """Trace `model`, analyze it at the micro-batch shape, split it: the whole transform.

    `args` hold the global batch (each of the plan's dp replicas takes 1/dp of it), or with
    `global_batch=False` one replica's batch (parallelize() inside a rank). `traced`: this model
    already traced with these inputs (`trace_model`), compiled from a copy and left as it is.
    `declared_batch`: the model file's batch_dims() (else the batch dims are found in the graph).
    `buffers`: the model's buffers' real values (`model` may be on meta), for context parallelism
    to read an attention mask built from one (passes/attention_form.py).
    """
    require_supported(plan)
    if plan.cp > 1 and not global_batch:
        raise GraphsplitError("--cp with parallelize() inside a rank is not supported yet: each rank would need "
                              "its shard of the sequence; use `graphsplit run` or drop cp")
    front = front_end(model, args, kwargs, source, loss_fn, target, declared_batch, buffers,
                      traced.copy() if traced is not None else None, sequence=plan.cp > 1)
    traced, flat, batch_dims, timings = front.traced, front.flat, front.batch, dict(front.timings)
    replicas = plan.sample_replicas if global_batch else 1
    start = time.perf_counter()
    if plan.cp > 1:  # attention in SDPA's form (its sizes from the analysis), then the sequence's mixers
        annotate(traced.gm, tuple(torch.as_tensor(t) for t in flat))
        if attention_form(traced.gm, traced.input_names, flat, buffers) or front.retraced:
            batch_dims = find_batch(traced, flat, loss_fn, target, declared_batch)
    sequence = require_sequence(traced, flat, plan, batch_dims) if plan.cp > 1 else None
    timings["batch"] += time.perf_counter() - start
    batch = batch_dims.size if batch_dims.batched else 1
    if batch_dims.whole_loss:  # the loss needs the whole batch: one micro-batch per replica, outputs gathered
        plan = _whole_loss_plan(plan, batch_dims.whole_loss)
        gather_before_tail(traced.gm, batch_dims, plan.dp)  # and a tail in the model, its inputs
    elif batch % replicas == 0:
        plan = plan.for_batch(batch // replicas)  # default micro-batches that divide this batch
    # Stages see micro-batches: analyze (shapes, bytes, FLOPs) at that size.
    pieces = plan.num_microbatches * replicas
    if pieces > 1:  # embedding bags cut with the batch read their piece's own offsets, checked
        own_bag_offsets(traced.gm, batch_dims)
    micro = first_microbatch(traced, flat, plan, replicas, batch_dims)
    if sequence is not None:  # stages see one cp rank's shard of each sequence
        micro = tuple(shard_values(micro, sequence.input_dims(traced.input_names), 0, plan.cp))
    start = time.perf_counter()
    try:
        annotate(traced.gm, tuple(torch.as_tensor(t) for t in micro))
    except GraphsplitError as exc:
        if pieces == 1 or "fails on input shape" not in str(exc) or "device" in str(exc):
            raise  # a decided condition says what it is itself; only a shape error is the piece's
        raise GraphsplitError(_piece_failed(str(exc), batch_dims, traced.input_names, flat, pieces)) from exc
    timings["analyze"] = time.perf_counter() - start
    micro_target = (split_microbatches(target, pieces, batch_dims.target_dims(target))[0]
                    if target is not None else None)
    if sequence is not None and micro_target is not None:
        micro_target = shard_tree(micro_target, sequence.target, 0, plan.cp)
    loss = (LossInput(loss_fn, micro_target, traced.out_spec, bool(batch_dims.whole_loss))
            if loss_fn is not None else None)
    run = run_passes(traced.gm, PassInput(plan, tuple(micro), fixed_cuts, loss, batch_dims), PASSES)
    timings.update({f"pass:{k}": v for k, v in run.timings.items()})
    tp = run.results.get(TensorParallelResult)
    vocab_loss = run.results.get(VocabParallelLoss)
    token_means = run.results.get(TokenMeans)
    experts = run.results.get(ExpertParallelResult)
    start = time.perf_counter()
    program = build_program(
        traced, plan,
        param_shardings=dict(tp.param_shardings) if tp else None,
        replicated=[w.to_dict() for w in tp.left_whole] if tp else None,
        loss_gm=vocab_loss.loss_gm if vocab_loss else token_means.loss_gm if token_means else None,
        sharded_outputs=dict(vocab_loss.sharded_outputs) if vocab_loss else None,
        token_means=token_means,
        batch_dims=batch_dims,
        expert_params=dict(experts.expert_params) if experts else None,
        expert_layers=experts.layers if experts else (),
    )
    program.expert_slots = dict(experts.expert_slots) if experts else {}
    fp8 = run.results.get(Float8Result)
    program.fp8_modules = fp8.modules if fp8 else ()
    timings["build"] = time.perf_counter() - start
    return RewriteResult(program, timings)


def rewrite_loaded(loaded: Any, plan: Plan, fixed_cuts: tuple[str, ...] | None = None,
                   traced: Traced | None = None) -> RewriteResult:
    """`rewrite_program` for a loaded model file: built on meta, with its loss and target (`traced`:
    its trace, `trace_loaded`'s, to compile several plans from one trace)."""
    return rewrite_program(
        loaded.build("meta"), loaded.args, loaded.kwargs, plan, loaded.path, fixed_cuts, loaded.loss_fn, loaded.target,
        traced=traced, declared_batch=loaded.batch_dims,
        buffers=loaded.buffer_values,
    )


def _piece_failed(why: str, batch: BatchDims, names: list[str], flat: tuple[Any, ...], pieces: int) -> str:
    """A model that runs on the whole batch and not on a piece of it: the inputs that went whole beside
    the cut ones are the likely cause (TimeMixer tiles its time marks over the batch)."""
    why = why.split("; make example_inputs()")[0]
    whole = [f"{n!r}" for n, t, d in zip(names, flat, batch.input_dims(names))
             if d is None and isinstance(t, torch.Tensor) and batch.size in tuple(t.shape)]
    beside = (f"; {', '.join(whole)} {'goes' if len(whole) == 1 else 'go'} whole to every piece (a dim of the batch's "
              "size the model mixes across samples) beside inputs cut into pieces") if whole else ""
    return (f"the model runs on the whole batch but not on 1/{pieces} of it: {why}{beside}; run with --dp 1 "
            "--microbatches 1, or give batch_dims() in the model file")


def trace_loaded(loaded: Any) -> Traced:
    """A loaded model file's trace (built on meta), for `rewrite_loaded(..., traced=)`."""
    model = loaded.build("meta")
    check_call(model, loaded.args, loaded.kwargs, loaded.path)
    return trace_model(model, loaded.args, loaded.kwargs, loaded.path, buffers=loaded.buffer_values)
