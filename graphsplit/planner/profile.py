"""The model's profile: what every op costs, per sample, for each tp degree and precision.

The model is built on meta and traced once. Deep models are folded (fold.py): the
head, two blocks and the tail are compiled instead of all of them. Each variant
(tp degree x fp32 or low precision) runs the passes that change what an op costs
(grad mode, tensor parallel, vocab-parallel loss, autocast) on that graph at one
and at two samples per micro-batch, is unfolded back to the whole sequence of ops,
and becomes an `OpTable` (tabulate.py): per op, FLOPs, bytes moved, bytes kept for backward and
output bytes, each as `per_sample * b + constant` (weights are read whatever the
batch), which parameters it reads and which collectives it runs; per cut, the bytes
live across it. A plan's micro-batch size then prices every op without compiling
again, and the pipeline cut is the compiler's own (`balanced_cuts`) on the same costs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..analysis.shapes import annotate
from ..errors import GraphsplitError
from ..front_end import front_end
from ..ir.meta import fresh_copy
from ..ir.trace import trace_model
from ..ir.traced_model import Traced
from ..loader import LoadedModel
from ..passes.autocast import autocast_pass
from ..passes.manager import LossInput, PassInput, run_passes
from ..passes.tensor_parallel import TensorParallelResult
from ..plan import Plan
from ..rewrite import pass_group
from ..runtime.microbatch import split_microbatches
from .alike_blocks import alike_blocks
from .fold import find_fold, fold
from .parallel import fork_map
from .table import OpTable
from .tabulate import Source, build_table


@dataclass
class ModelProfile:
    """Everything the search prices plans from; a variant's table is built when a plan first needs it."""

    batch: int  # samples in the global batch (example_inputs)
    tokens_per_sample: int | None
    model_flops_per_sample: float
    max_stages: int
    has_blocks: bool
    # (tp, low precision, sequence parallel) -> its table, or why it cannot be
    variants: dict[tuple[int, bool, bool], OpTable | str]
    folded: bool
    has_cores: bool = False  # written-out attention (`--checkpoint attention`'s regions)
    experts: int = 0  # what every MoE layer's expert count divides (0: no MoE layer): the ep degrees possible
    # the sequence context parallelism can cut (attention calls alone mix it): its length; 0 none, and why
    sequence: int = 0
    no_sequence: str = ""
    source: Source = field(repr=False, default=None)  # type: ignore[assignment]
    hardware: Any = None  # set by the search

    def table(self, plan: Plan) -> OpTable:
        key = (plan.tp, plan.autocast is not None, plan.sequence_parallel)
        if key not in self.variants:
            self.add(build_all_tables(self.source, ((plan.tp, plan.sequence_parallel),)))
        found = self.variants[key]
        if isinstance(found, str):
            raise GraphsplitError(found)
        return found

    def read_reference(self) -> None:
        """What the tp 1 fp32 table says of the model: its FLOPs, its places to cut, whether it has
        repeated blocks. Raises when the model cannot be compiled at all."""
        reference = self.table(Plan())
        # the FLOPs of the whole example batch per sample: with one sample no dim scales with the batch, and
        # every op's FLOPs are the constant part, which counts once per batch, not per sample
        self.model_flops_per_sample = float(reference.flops[0].sum() + reference.flops[1].sum() / max(self.batch, 1))
        self.max_stages = int((~reference.blocked[1:reference.n]).sum()) + 1
        self.has_blocks = bool((reference.block >= 0).any())
        self.has_cores = reference.core is not None and bool((reference.core >= 0).any())
        counts = set(reference.expert_params().values())
        self.experts = math.gcd(*counts) if counts else 0

    def for_batch(self, samples: int) -> ModelProfile:
        """This profile for a global batch of `samples` (its tables are per sample: they are shared)."""
        sized = dataclasses.replace(self, batch=samples)
        sized.read_reference()  # the FLOPs per sample count the batch's constant part over it
        return sized

    def only(self, tp: int, low: bool, sp: bool = False) -> ModelProfile:
        """This profile holding one variant and no trace: what pricing that variant's plans needs, small
        enough to send to another process."""
        return dataclasses.replace(self, variants={(tp, low, sp): self.variants[tp, low, sp]}, source=None)

    def add(self, built: dict[Degree, dict[bool, OpTable] | str]) -> None:
        """Tables `build_all_tables` built (or why a degree has none)."""
        for (tp, sp), tables in built.items():
            if isinstance(tables, str):
                what = f"tp={tp}{' with sequence parallelism' if sp else ''}"
                self.variants[tp, False, sp] = self.variants[tp, True, sp] = f"{what}: {tables}"
            else:
                for low, table in tables.items():
                    self.variants[tp, low, sp] = table


def _inputs_of(flat: Sequence[Any], samples: int, dims: Sequence[int | None] | None = None,
               batch: int | None = None) -> tuple[torch.Tensor, ...]:
    """The example inputs cut (or repeated) to `samples` along each one's batch dim (`dims`, found in
    the graph; None: the input has no batch and stays whole; default dim 0 of each)."""
    dims = list(dims) if dims is not None else [0] * len(flat)
    n = batch or flat_batch(flat)
    one = split_microbatches(tuple(flat), n, dims)[0] if n > 1 else tuple(flat)
    return tuple(torch.cat([t] * samples, dim=d) if isinstance(t, torch.Tensor) and d is not None and t.dim() > d
                 else t for t, d in zip(one, dims))


def flat_batch(flat: Sequence[Any]) -> int:
    for t in flat:
        if isinstance(t, torch.Tensor) and t.dim():
            return int(t.shape[0])
    raise GraphsplitError("no batched tensor among example_inputs()")


def _compiled(src: Source, tp: int, sp: bool = False) -> dict[bool, tuple[fx.GraphModule, dict[str, Any]]]:
    """The graph after the cost passes at two samples per micro-batch, in fp32 and in low precision:
    tensor parallelism (with sequence parallelism: `sp`) runs once, autocast on a copy of its result."""
    gm = fresh_copy(src.base)  # annotated at two samples once (profile_model)
    plan = Plan(tp=tp, sequence_parallel=sp)
    inp = PassInput(plan, src.inputs[0], None, src.losses[0])
    run = run_passes(gm, inp, pass_group("cost"))
    found = run.results.get(TensorParallelResult)
    shardings = dict(found.param_shardings) if found else {}
    low, _ = autocast_pass(fresh_copy(run.gm), dataclasses.replace(inp, plan=plan.replace(autocast="bf16")),
                           run.results)
    return {False: (run.gm, shardings), True: (low, shardings)}


Degree = tuple[int, bool]  # (tp, sequence parallel): what a table is compiled at


def build_tables(src: Source, degree: Degree) -> dict[bool, OpTable]:
    """The fp32 and the low-precision table of one tp degree (with or without sequence parallelism)."""
    tp, sp = degree
    return {low: build_table(gm, shardings, src, tp, low) for low, (gm, shardings) in _compiled(src, tp, sp).items()}


def tables_or_reason(src: Source, degree: Degree) -> dict[bool, OpTable] | str:
    """The tables, or one line on why they cannot be built (any failure: it may run in a forked
    worker, whose exceptions must come back as values; an unpicklable one would never arrive)."""
    try:
        return build_tables(src, degree)
    except GraphsplitError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - e.g. a torch module reading values on meta
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"profiling failed: {type(exc).__name__}: {first}"


def build_all_tables(src: Source, degrees: Sequence[Degree]) -> dict[Degree, dict[bool, OpTable] | str]:
    """`build_tables` of every degree (or why it cannot be built), on the machine's cores: the degrees
    are independent, and each costs seconds on a deep model."""
    return dict(zip(degrees, fork_map(tables_or_reason, src, degrees)))


def tokens_per_sample(flat: Sequence[Any], dims: Sequence[int | None] | None = None) -> int | None:
    """The sequence length when the model reads token ids (an integer input of 2 or more dims): its
    elements per example along its batch dim (`dims`; default dim 0)."""
    dims = list(dims) if dims is not None else [0] * len(flat)
    for t, d in zip(flat, dims):
        if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() >= 2 and d is not None:
            return int(t.numel() // t.shape[d])
    return None


def start_profile(loaded: LoadedModel, fused_attention: bool = False) -> ModelProfile:
    """Trace `loaded` (built on meta) once and fold it; no table yet: `add(build_all_tables(...))`
    builds them, then `read_reference` takes what the tp 1 table says of the model.
    `fused_attention`: price attention's memory as a GPU runs it."""
    model = loaded.build("meta")
    blocks, alike = alike_blocks(model)

    def first_trace() -> Traced:
        # blocks alike the second are traced as one call each, and fold stands the second in for them
        traced = trace_model(model, loaded.args, loaded.kwargs, loaded.path, leaves=alike,
                             watch=frozenset(blocks[:2]) if alike else frozenset(), buffers=loaded.buffer_values)
        if alike and find_fold(traced.gm, traced.calls, alike) is None:  # not called alike: traced through
            traced = trace_model(model, loaded.args, loaded.kwargs, loaded.path, buffers=loaded.buffer_values)
        return traced

    # the compiler's own front end: the batch as the program cuts it, the graph as it compiles it
    front = front_end(model, loaded.args, loaded.kwargs, loaded.path, loaded.loss_fn, loaded.target,
                      loaded.batch_dims, loaded.buffer_values, first_trace=first_trace)
    traced, flat, batch_dims = front.traced, front.flat, front.batch
    found = fold(traced.gm, traced.calls, alike) if traced.calls and not front.retraced else fold(traced.gm)
    dims = batch_dims.input_dims(traced.input_names)
    batch = batch_dims.size if batch_dims.size else 1
    losses: tuple[LossInput | None, LossInput | None] = (None, None)
    if loaded.loss_fn is not None and loaded.target is not None:
        target_dims = batch_dims.target_dims(loaded.target)
        one = split_microbatches(loaded.target, batch, target_dims)[0] if batch > 1 else loaded.target
        leaves, spec = torch.utils._pytree.tree_flatten(one)

        def repeated(k: int) -> Any:
            return torch.utils._pytree.tree_unflatten(
                [torch.cat([t] * k, dim=d) if isinstance(t, torch.Tensor) and d is not None else t
                 for t, d in zip(leaves, target_dims)], spec)

        losses = (LossInput(loaded.loss_fn, repeated(2), traced.out_spec),
                  LossInput(loaded.loss_fn, repeated(4), traced.out_spec))
    base, fold_ = found if found is not None else (traced.gm, None)
    source = Source(base, fold_, (_inputs_of(flat, 2, dims, batch), _inputs_of(flat, 4, dims, batch)), losses,
                     fused_attention)
    annotate(base, source.inputs[0])
    sequence, no_sequence = _cuttable_sequence(base, traced, flat, loaded)
    return ModelProfile(batch=batch, tokens_per_sample=tokens_per_sample(flat, dims), model_flops_per_sample=0.0,
                        max_stages=1, has_blocks=False, variants={}, folded=fold_ is not None, source=source,
                        sequence=sequence, no_sequence=no_sequence)


def _cuttable_sequence(gm: fx.GraphModule, traced: Any, flat: Sequence[Any], loaded: LoadedModel) -> tuple[int, str]:
    """The length of the sequence `--cp` could cut, found as the compiler finds it (on the folded graph,
    whose blocks are traced through), or 0 and why not."""
    from ..analysis.batch import find_batch_dims
    from ..passes.attention_form import attention_form
    from ..passes.context_parallel import check_masks, check_sequence_mixers

    loss = None
    if loaded.loss_fn is not None:
        def loss(raw: Any, target: Any) -> Any:
            return loaded.loss_fn(traced.unflatten_output(raw), target)

    gm = fresh_copy(gm)  # attention in SDPA's form, as the compiler puts it under --cp
    attention_form(gm, traced.input_names, flat, loaded.buffer_values)
    found = find_batch_dims(gm, traced.input_names, flat, lambda raw: list(raw) if isinstance(raw, tuple | list) else [raw],
                            loss, loaded.target, loaded.batch_dims).sequence
    if found is None:
        return 0, "no attention call mixes a dim of the inputs"
    try:
        check_masks(gm)
        check_sequence_mixers(gm, found.mixers)
    except GraphsplitError as exc:
        return 0, str(exc).removeprefix("--cp: ").split("; drop --cp")[0]
    if found.merged:
        return 0, f"{found.merged[0]} holds the sequence merged with another dim"
    return found.length, ""


def profile_model(loaded: LoadedModel, tp_degrees: Sequence[int] = (1,), fused_attention: bool = False
                  ) -> ModelProfile:
    """Trace `loaded` once; build the tables of `tp_degrees` in fp32 and low precision now (the rest
    when a plan needs them). `fused_attention`: price attention's memory as a GPU runs it."""
    profile = start_profile(loaded, fused_attention)
    profile.add(build_all_tables(profile.source, sorted({(1, False), *((tp, False) for tp in tp_degrees)})))
    profile.read_reference()
    return profile
