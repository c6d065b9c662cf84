"""The model's profile: what every op costs, per sample, for each tp degree and precision.

The model is built on meta and traced once. Deep models are folded (fold.py): the
head, two blocks and the tail are compiled instead of all of them. Each variant
(tp degree x fp32 or low precision) runs the passes that change what an op costs
(grad mode, tensor parallel, vocab-parallel loss, autocast) on that graph at one
and at two samples per micro-batch, is unfolded back to the whole sequence of ops,
and becomes an `OpTable`: per op, FLOPs, bytes moved, bytes kept for backward and
output bytes, each as `per_sample * b + constant` (weights are read whatever the
batch), which parameters it reads and which collectives it runs; per cut, the bytes
live across it. A plan's micro-batch size then prices every op without compiling
again, and the pipeline cut is the compiler's own (`balanced_cuts`) on the same costs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from ..analysis.collectives import node_collectives
from ..analysis.recompute import recomputable
from ..analysis.shapes import annotate
from ..compile import PASSES, check_call, export_batch_dims, find_batch
from ..errors import GraphsplitError
from ..ir.meta import block_of, canonical_names, fresh_copy, info
from ..ir.optable import OpKind
from ..ir.sharding import local_shape
from ..ir.trace import trace_model
from ..loader import LoadedModel
from ..passes.autocast import autocast_pass
from ..passes.manager import LossInput, PassInput, run_passes
from ..passes.tensor_parallel import TensorParallelResult
from ..plan import Plan
from ..runtime.microbatch import split_microbatches
from .fold import Fold, fold
from .measure import measure, node_params, out_bytes
from .parallel import fork_map
from .replicas import alike_blocks
from .table import OpTable
from .tile import expand, short_fold

SELECTIVE_KINDS = frozenset({OpKind.LINEAR, OpKind.GROUPED_LINEAR, OpKind.MATMUL, OpKind.ATTENTION,
                             OpKind.CONV})  # matmul-class


@dataclass
class _Source:
    """What a table is compiled from: the (folded) traced graph and its example micro-batches."""

    base: fx.GraphModule
    fold: Fold | None
    inputs: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]  # two and four samples
    losses: tuple[LossInput | None, LossInput | None]
    fused_attention: bool = False  # price attention's memory as a GPU's fused kernel keeps it


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
    experts: int = 0  # what every MoE layer's expert count divides (0: no MoE layer): the ep degrees possible
    # the sequence context parallelism can cut (attention calls alone mix it): its length; 0 none, and why
    sequence: int = 0
    no_sequence: str = ""
    source: _Source = field(repr=False, default=None)  # type: ignore[assignment]
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
        self.model_flops_per_sample = float(reference.flops[0].sum())
        self.max_stages = int((~reference.blocked[1:reference.n]).sum()) + 1
        self.has_blocks = bool((reference.block >= 0).any())
        counts = set(reference.expert_params().values())
        self.experts = math.gcd(*counts) if counts else 0

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


def _compiled(src: _Source, tp: int, sp: bool = False) -> dict[bool, tuple[fx.GraphModule, dict[str, Any]]]:
    """The graph after the cost passes at two samples per micro-batch, in fp32 and in low precision:
    tensor parallelism (with sequence parallelism: `sp`) runs once, autocast on a copy of its result."""
    gm = fresh_copy(src.base)  # annotated at two samples once (profile_model)
    plan = Plan(tp=tp, sequence_parallel=sp)
    inp = PassInput(plan, src.inputs[0], None, src.losses[0])
    run = run_passes(gm, inp, [p for p in PASSES if p[0] in ("grad_mode", "tensor_parallel", "vocab_parallel_loss")])
    found = run.results.get(TensorParallelResult)
    shardings = dict(found.param_shardings) if found else {}
    low, _ = autocast_pass(fresh_copy(run.gm), dataclasses.replace(inp, plan=plan.replace(autocast="bf16")),
                           run.results)
    return {False: (run.gm, shardings), True: (low, shardings)}


def _linear(two: np.ndarray, four: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per sample, constant) from the values at two and four samples per micro-batch (not one: at one
    sample some ops keep a view where they keep a copy at any other size)."""
    per_sample = (four - two) // 2
    return per_sample, two - 2 * per_sample


def _pair(two: int, four: int) -> tuple[int, int]:
    return (four - two) // 2, two - (four - two)


Degree = tuple[int, bool]  # (tp, sequence parallel): what a table is compiled at


def build_tables(src: _Source, degree: Degree) -> dict[bool, OpTable]:
    """The fp32 and the low-precision table of one tp degree (with or without sequence parallelism)."""
    tp, sp = degree
    return {low: build_table(gm, shardings, src, tp, low) for low, (gm, shardings) in _compiled(src, tp, sp).items()}


def tables_or_reason(src: _Source, degree: Degree) -> dict[bool, OpTable] | str:
    """The tables, or one line on why they cannot be built (any failure: it may run in a forked
    worker, whose exceptions must come back as values; an unpicklable one would never arrive)."""
    try:
        return build_tables(src, degree)
    except GraphsplitError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - e.g. a torch module reading values on meta
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"profiling failed: {type(exc).__name__}: {first}"


def build_all_tables(src: _Source, degrees: Sequence[Degree]) -> dict[Degree, dict[bool, OpTable] | str]:
    """`build_tables` of every degree (or why it cannot be built), on the machine's cores: the degrees
    are independent, and each costs seconds on a deep model."""
    return dict(zip(degrees, fork_map(tables_or_reason, src, degrees)))


def build_table(gm: fx.GraphModule, shardings: dict[str, Any], src: _Source, tp: int, low: bool) -> OpTable:
    """`gm` compiled at two samples: measured there and, annotated again, at four; a deep model's
    over a few copies of its block, then tiled to all of them (tile.py)."""
    whole = src.fold
    fold_ = (short_fold(whole) or whole) if whole is not None else None
    four = fresh_copy(gm)
    annotate(four, src.inputs[1], param_shardings=shardings, tp=tp)
    a = measure(gm, shardings, fold_, tp, src.inputs[0], src.fused_attention)
    b = measure(four, shardings, fold_, tp, src.inputs[1], src.fused_attention)
    if len(a.unf) != len(b.unf):
        raise GraphsplitError("internal: the profile compiled differently at two batch sizes")
    names = canonical_names(a.gm)
    param_bytes: dict[str, int] = {}
    param_shapes: dict[str, tuple[int, ...]] = {}
    for name, p in a.gm.named_parameters():
        sharding = a.shardings.get(name)
        shape = local_shape(tuple(p.shape), sharding, tp) if sharding is not None else tuple(p.shape)
        param_bytes[name] = int(np.prod(shape, dtype=np.int64)) * p.element_size()
        param_shapes[name] = shape
    n = len(a.unf)
    block_names: list[str] = []
    block_index: dict[str, int] = {}
    params: list[tuple[str, ...]] = []
    blocks = np.full(n, -1, dtype=np.int64)
    collectives: list[tuple[int, str, str, int, int]] = []
    recomp, memo = recomputable(a.gm.graph), {}
    lows = np.zeros(n, dtype=bool)
    compute = np.zeros(n, dtype=bool)
    grouped = np.zeros(n, dtype=bool)
    expert_layers: dict[tuple[Any, int], list[tuple[int, fx.Node, fx.Node]]] = {}  # (offsets, copy) -> its linears
    for i, ((node, k), (node2, _)) in enumerate(zip(a.unf.sequence, b.unf.sequence)):
        ni = info(node)
        module = fold_.block_name(ni.module, k) if fold_ is not None and k else ni.module
        block = block_of(module)
        if block is not None:
            if block not in block_index:
                block_index[block] = len(block_names)
                block_names.append(block)
            blocks[i] = block_index[block]
        # a value made from parameters alone (a weight's cast) is made again by each stage reading it
        # (ir/program.py): its readers hold the parameters, a stage the cut leaves it in alone does not
        here = [] if node in recomp else list(node_params(a.gm, node, names, recomp, memo))
        if fold_ is not None and k:
            for name in here:
                param_bytes.setdefault(fold_.block_name(name, k), param_bytes[name])
                param_shapes.setdefault(fold_.block_name(name, k), param_shapes[name])
            here = [fold_.block_name(name, k) for name in here]
        params.append(tuple(here))
        lows[i] = ni.tensor is not None and ni.tensor.dtype in (torch.bfloat16, torch.float16)
        compute[i] = ni.kind in SELECTIVE_KINDS
        if ni.kind == OpKind.GROUPED_LINEAR and len(node.args) > 2:
            grouped[i] = True
            expert_layers.setdefault((node.args[2], k), []).append((i, node, node2))
        if ni.kind == OpKind.ATTENTION and node.op == "call_function":  # what context parallelism gathers
            kv_a, kv_b = _gathered_bytes(node), _gathered_bytes(node2)
            collectives += [(i, direction, "cp_gather", *_pair(kv_a, kv_b)) for direction in ("forward", "backward")]
        for direction, kind in node_collectives(node):
            src, src2 = (node, node2) if kind == "all_gather" else (node.args[0], node2.args[0])
            collectives.append((i, direction, kind, *_pair(info(src).out_bytes, info(src2).out_bytes)))
    # what expert parallelism divides: values made from expert weights alone (a transpose, a cast), the
    # bytes each op moves of them, and the storages holding them
    expert_names = {name for i in np.flatnonzero(grouped) for name in params[i]}
    from_experts: set[fx.Node] = set()
    for node in a.gm.graph.nodes:
        if node.op == "get_attr":
            try:
                if names.get(id(a.gm.get_parameter(str(node.target)))) in expert_names:
                    from_experts.add(node)
            except AttributeError:  # a buffer or constant
                pass
        elif node.op in ("call_function", "call_method") and info(node).kind != OpKind.GROUPED_LINEAR:
            tensors = [x for x in node.all_input_nodes if info(x).value == "tensor" or x.op == "get_attr"]
            if tensors and all(x in from_experts for x in tensors):
                from_experts.add(node)
    expert_made = {x.name for x in from_experts}
    # casts of parameters alone to the low dtype: a matmul's weight, which FSDP gathers already cast
    from_params: set[fx.Node] = set()
    for node in a.gm.graph.nodes:
        if node.op == "get_attr":
            with contextlib.suppress(AttributeError):  # a buffer or constant is not a parameter
                a.gm.get_parameter(str(node.target))
                from_params.add(node)
        elif node.op in ("call_function", "call_method"):
            tensors = [x for x in node.all_input_nodes if info(x).value == "tensor" or x.op == "get_attr"]
            if tensors and all(x in from_params for x in tensors):
                from_params.add(node)
    # (the profile's parameters are fp32: a low-dtype value made from them alone is a cast of them)
    weight_cast = np.array([node in from_params and node.op != "get_attr" and info(node).tensor is not None
                            and info(node).tensor.dtype in (torch.bfloat16, torch.float16)
                            for node, _ in a.unf.sequence], dtype=bool)
    cast_made = {node.name for i, (node, _) in enumerate(a.unf.sequence) if weight_cast[i]}
    grouped_names = {node.name for i, (node, _) in enumerate(a.unf.sequence) if grouped[i]}
    expert_bytes = np.zeros(n, dtype=np.int64)
    for i, (node, _) in enumerate(a.unf.sequence):
        if not from_experts:
            break
        moved = sum(info(x).out_bytes or info(x).param_bytes for x in node.all_input_nodes if x in from_experts)
        expert_bytes[i] = moved + (info(node).out_bytes if node in from_experts else 0)
    for linears in expert_layers.values():  # the rows expert parallelism would move: in before, out after
        (i, first, first2), (j, last, last2) = linears[0], linears[-1]
        rows_in = _pair(info(first.args[0]).out_bytes, info(first2.args[0]).out_bytes)
        rows_out = _pair(info(last).out_bytes, info(last2).out_bytes)
        for direction in ("forward", "backward"):
            collectives += [(i, direction, "all_to_all", *rows_in), (j, direction, "all_to_all", *rows_out)]
    same = dict(zip(a.gm.graph.nodes, b.gm.graph.nodes))  # the node of the compile at four samples
    size_a, size_b = out_bytes(a.gm), out_bytes(b.gm)
    # every tensor each op reads (parameters aside), with where it was made
    value_ids: dict[tuple[fx.Node, int], int] = {}
    reads: list[tuple[tuple[int, int, int, int], ...]] = []
    for op in a.unf.sequence:
        row = []
        for src in op[0].all_input_nodes:
            if src.op == "get_attr" or info(src).value != "tensor":
                continue
            value = a.unf.value(src, op)
            vid = value_ids.setdefault(value, len(value_ids))
            row.append((vid, a.unf.position.get(value, -1), *_pair(size_a[src], size_b[same[src]])))
        reads.append(tuple(row))
    # what each block reads from outside it: the stream (the block before's output, read by this block
    # alone) and the values the head shares with every block (read by several: masks, rotary tables)
    readers: dict[tuple[fx.Node, int], set[int]] = {}
    for i, op in enumerate(a.unf.sequence):
        if blocks[i] < 0:
            continue
        for src in op[0].all_input_nodes:
            value = a.unf.value(src, op)
            j = a.unf.position.get(value, -1)
            if src.op != "get_attr" and info(src).value == "tensor" and (j < 0 or blocks[j] != blocks[i]):
                readers.setdefault(value, set()).add(int(blocks[i]))
    totals = {bi: [[0, 0], [0, 0]] for bi in range(len(block_names))}
    for (src, _), consumers in readers.items():
        per_sample, constant = _pair(size_a[src], size_b[same[src]])
        kind = 0 if len(consumers) == 1 else 1
        for bi in consumers:
            totals[bi][kind][0] += per_sample
            totals[bi][kind][1] += constant
    block_inputs = {bi: ((st[0], st[1]), (sh[0], sh[1])) for bi, (st, sh) in totals.items()}
    # what each op keeps, as storage ids (one storage kept by several ops of a stage counts once there)
    ids: dict[tuple[str, int, int], int] = {}
    kept_ids: list[tuple[int, ...]] = []
    kept_bytes: dict[int, tuple[int, int]] = {}
    for mine_a, mine_b in zip(a.kept, b.kept):
        row = []
        for (key, two), (_, four) in zip(mine_a, mine_b):
            kid = ids.setdefault(key, len(ids))
            kept_bytes[kid] = _pair(two, four)
            row.append(kid)
        kept_ids.append(tuple(row))
    storage = np.array([kept_bytes[i] for i in range(len(ids))], dtype=np.int64).reshape(-1, 2)
    outputs = next(x for x in reversed(a.gm.graph.nodes) if x.op == "output").all_input_nodes
    period = None
    if fold_ is not None:
        first = next(i for i, (_, k) in enumerate(a.unf.sequence) if k)
        length = len(a.unf.second)
        period = (first, length, first + (fold_.count - 1) * length)
    output = _pair(sum(info(x).out_bytes for x in outputs), sum(info(same[x]).out_bytes for x in outputs))
    table = OpTable(
        tp=tp, low=low,
        flops=_linear(a.flops, b.flops), bytes=_linear(a.bytes, b.bytes), kept=kept_ids,
        storage=(storage[:, 0], storage[:, 1]), storage_keys=list(ids),
        out=_linear(a.out, b.out), selective=_linear(a.selective, b.selective), live=_linear(a.live, b.live), blocked=a.blocked | b.blocked,
        low_rate=lows, compute=compute, block=blocks, blocks=block_names, block_inputs=block_inputs, reads=reads,
        params=params, param_bytes=param_bytes, param_shapes=param_shapes, collectives=collectives, output=output,
        period=period, grouped=grouped, expert_bytes=expert_bytes,
        # a grouped matmul keeps its (cast) weight for backward: a storage of it that does not grow with
        # the batch holds expert weights
        expert_storage=np.array([key[0] in expert_made or (key[0] in grouped_names and not storage[k, 0])
                                 for k, key in enumerate(ids)], dtype=bool),
        weight_cast=weight_cast, cast_storage=np.array([a.makers.get(key) in cast_made for key in ids], dtype=bool),
    )
    return expand(table, fold_, whole) if fold_ is not whole else table


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
    check_call(model, loaded.args, loaded.kwargs, loaded.path)
    blocks, alike = alike_blocks(model)
    # blocks alike the second are traced as one call each, and fold stands the second in for them
    traced = trace_model(model, loaded.args, loaded.kwargs, loaded.path, leaves=alike,
                         watch=frozenset(blocks[:2]) if alike else frozenset())
    found = fold(traced.gm, traced.calls, alike)
    if found is None and alike:  # they were not called alike: the whole model, traced through
        traced = trace_model(model, loaded.args, loaded.kwargs, loaded.path)
        found = fold(traced.gm)
    flat = traced.flatten_inputs(loaded.args, loaded.kwargs)
    # where each input holds the batch (analysis/batch/), as the program cuts it
    batch_dims = find_batch(traced, flat, loaded.loss_fn, loaded.target, loaded.batch_dims)
    symbolic = export_batch_dims(traced, flat, batch_dims)
    if symbolic is not None:
        traced = trace_model(model, loaded.args, loaded.kwargs, loaded.path, batch_dims=symbolic)
        found = fold(traced.gm)
        flat = traced.flatten_inputs(loaded.args, loaded.kwargs)
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
    source = _Source(base, fold_, (_inputs_of(flat, 2, dims, batch), _inputs_of(flat, 4, dims, batch)), losses,
                     fused_attention)
    annotate(base, source.inputs[0])
    sequence, no_sequence = _cuttable_sequence(base, traced, flat, loaded)
    return ModelProfile(batch=batch, tokens_per_sample=tokens_per_sample(flat, dims), model_flops_per_sample=0.0,
                        max_stages=1, has_blocks=False, variants={}, folded=fold_ is not None, source=source,
                        sequence=sequence, no_sequence=no_sequence)


def _gathered_bytes(attention: fx.Node) -> int:
    """The keys' and values' bytes context parallelism gathers at `attention`: before a grouped-query
    expansion, as the pass gathers them (passes/context_parallel.py)."""
    from ..passes.context_parallel import head_repeat

    k, v = attention.args[1:3]
    ek, ev = head_repeat(k, attention), head_repeat(v, attention)
    repeats = ek.repeats if ek is not None and ev is not None and ek.repeats == ev.repeats else 1
    return sum(info(x).out_bytes for x in (k, v) if isinstance(x, fx.Node)) // repeats


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
