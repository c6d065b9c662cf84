"""Two measured compiles of one variant (measure.py) at two and four samples per micro-batch, as
an `OpTable`: per op FLOPs, bytes moved, bytes kept and output bytes as `per_sample * b + constant`,
the parameters it reads, the collectives it runs, which repeated block it lies in, the values made
from expert weights or cast from parameters alone; per cut, the bytes live across it. A folded
profile's table is tiled to every block (tile.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from ..analysis.attention_cores import attention_cores
from ..analysis.collectives import node_collectives, payload_bytes
from ..analysis.recompute import recomputable
from ..analysis.shapes import annotate
from ..errors import GraphsplitError
from ..ir.meta import block_of, canonical_names, fresh_copy, info
from ..ir.op_kinds import OpKind
from ..ir.sharding import local_shape
from ..ops.tp import column_linear_from_seq_shard
from ..passes.manager import LossInput
from .fold import Fold
from .measure import measure, node_params, out_bytes
from .rings import DROPPED, float8_tags, ring_tags
from .table import OpTable
from .tile import expand, short_fold

SELECTIVE_KINDS = frozenset({OpKind.LINEAR, OpKind.GROUPED_LINEAR, OpKind.MATMUL, OpKind.ADD_MATMUL, OpKind.ATTENTION,
                             OpKind.CONV})  # matmul-class


@dataclass
class Source:
    """What a table is compiled from: the (folded) traced graph and its example micro-batches."""

    base: fx.GraphModule
    fold: Fold | None
    inputs: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]  # two and four samples
    losses: tuple[LossInput | None, LossInput | None]
    fused_attention: bool = False  # price attention's memory as a GPU's fused kernel keeps it


def _linear(two: np.ndarray, four: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per sample, constant) from the values at two and four samples per micro-batch (not one: at one
    sample some ops keep a view where they keep a copy at any other size)."""
    per_sample = (four - two) // 2
    return per_sample, two - 2 * per_sample


def _pair(two: int, four: int) -> tuple[int, int]:
    return (four - two) // 2, two - (four - two)


def _made_from(gm: fx.GraphModule, chosen: Callable[[str], bool]) -> set[fx.Node]:
    """The parameters `chosen` (by their name in `gm`) and the values made from them alone (a
    transpose, a cast): every tensor an op reads is one of them."""
    found: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            with contextlib.suppress(AttributeError):  # a buffer or constant is not a parameter
                if chosen(str(node.target)):
                    gm.get_parameter(str(node.target))
                    found.add(node)
        elif node.op in ("call_function", "call_method"):
            tensors = [x for x in node.all_input_nodes if info(x).value == "tensor" or x.op == "get_attr"]
            if tensors and all(x in found for x in tensors):
                found.add(node)
    return found


def build_table(gm: fx.GraphModule, shardings: dict[str, Any], src: Source, tp: int, low: bool) -> OpTable:
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
    fp8 = np.zeros(n, dtype=bool)
    cast = np.zeros((n, 2), dtype=np.int64)  # a float8 linear's operands (its input and weight), as read
    elems = np.zeros((n, 2), dtype=np.int64)  # and their elements
    compute = np.zeros(n, dtype=bool)
    grouped = np.zeros(n, dtype=bool)
    gemm = np.zeros((n, 2), dtype=np.int64)  # a plain GEMM's (K, N)
    core_of = {node: c for c, nodes in enumerate(attention_cores(a.gm)) for node in nodes}
    same = dict(zip(a.gm.graph.nodes, b.gm.graph.nodes))  # the node of the compile at four samples
    position = {op: i for i, op in enumerate(a.unf.sequence)}
    rings = ring_tags(a.gm, same, tp)
    floats = float8_tags(a.gm, same, tp, lambda node: _fp8_linear(a.gm, node))
    gather_cast = np.zeros((n, 2), dtype=np.int64)  # the operands' bytes where tensorwise float8 gathers
    gather_elems = np.zeros((n, 2), dtype=np.int64)
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
        if ni.kind in (OpKind.LINEAR, OpKind.MATMUL, OpKind.ADD_MATMUL):
            gemm[i] = _gemm_dims(node, ni.kind)
        fp8[i] = ni.kind == OpKind.LINEAR and _fp8_linear(a.gm, node)
        if fp8[i]:
            cast[i] = _pair(_operand_bytes(node), _operand_bytes(node2))
            elems[i] = _pair(_operand_bytes(node, per_element=True), _operand_bytes(node2, per_element=True))
            gather_cast[i], gather_elems[i] = cast[i], elems[i]
            if node in floats.casts:  # the weight's cast, and the first linear's of the shard
                shard = floats.casts[node]
                gather_cast[i] = _pair(_operand_bytes(node, shard=shard), _operand_bytes(node2, shard=same.get(shard)))
                gather_elems[i] = _pair(_operand_bytes(node, True, shard), _operand_bytes(node2, True, same.get(shard)))
        if ni.kind == OpKind.GROUPED_LINEAR and len(node.args) > 2:
            grouped[i] = True
            expert_layers.setdefault((node.args[2], k), []).append((i, node, node2))
        if ni.kind == OpKind.ATTENTION and node.op == "call_function":  # what context parallelism gathers
            kv_a, kv_b = _gathered_bytes(node), _gathered_bytes(node2)
            collectives += [(i, direction, "cp_gather", *_pair(kv_a, kv_b), None) for direction in ("forward", "backward")]
        for direction, kind in node_collectives(node):
            # the message as nccl-tests size it (a gather's whole, a reduce-scatter's whole input), whichever
            # way it runs: backward, a gather's gradient is reduce-scattered whole
            ring = rings.get((node, direction, kind))
            if ring is not None and ring is not DROPPED:  # the matmuls it would hide behind, by their place here
                ring = (*ring[:2], tuple(position[(m, k)] - i for m in ring[2]), ring[3])
            fp8_tag = floats.collectives.get((node, direction, kind))
            collectives.append((i, direction, kind, *_pair(payload_bytes(node, tp, kind), payload_bytes(node2, tp, kind)), ring,
                                fp8_tag))
    # what expert parallelism divides: values made from expert weights alone (a transpose, a cast), the
    # bytes each op moves of them, and the storages holding them
    expert_names = {name for i in np.flatnonzero(grouped) for name in params[i]}
    from_experts = _made_from(a.gm, lambda name: names.get(id(a.gm.get_parameter(name))) in expert_names)
    expert_made = {x.name for x in from_experts}
    # casts of parameters alone to the low dtype: a matmul's weight, which FSDP gathers already cast
    # (the profile's parameters are fp32: a low-dtype value made from them alone is a cast of them)
    from_params = _made_from(a.gm, lambda name: True)
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
            collectives += [(i, direction, "all_to_all", *rows_in, None), (j, direction, "all_to_all", *rows_out, None)]
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
    # the shards tensorwise float8 gathering keeps a byte an element, where its linears keep them
    shard_names = {x.name for x in floats.casts.values() if x is not None}
    kept_by_sites = {key for (op, _), mine in zip(a.unf.sequence, a.kept) if op in floats.casts for key, _ in mine}
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
        selective_attention=_linear(a.selective_attention, b.selective_attention), matmul_calls=a.matmul_calls,
        low_rate=lows, fp8=fp8, fp8_cast=(cast[:, 0], cast[:, 1]), compute=compute, block=blocks, blocks=block_names, block_inputs=block_inputs, reads=reads,
        params=params, param_bytes=param_bytes, param_shapes=param_shapes, collectives=collectives, output=output,
        period=period, grouped=grouped, expert_bytes=expert_bytes,
        # a grouped matmul keeps its (cast) weight for backward: a storage of it that does not grow with
        # the batch holds expert weights
        expert_storage=np.array([key[0] in expert_made or (key[0] in grouped_names and not storage[k, 0])
                                 for k, key in enumerate(ids)], dtype=bool),
        weight_cast=weight_cast, cast_storage=np.array([a.makers.get(key) in cast_made for key in ids], dtype=bool),
        storage_maker=np.array([a.maker_pos.get(key, -1) for key in ids], dtype=np.int64),
        gemm_k=gemm[:, 0], gemm_n=gemm[:, 1],
        fp8_elems=(elems[:, 0], elems[:, 1]),
        fp8_gather_cast=(gather_cast[:, 0], gather_cast[:, 1]), fp8_gather_elems=(gather_elems[:, 0], gather_elems[:, 1]),
        fp8_shard_storage=np.array([a.makers.get(key) in shard_names and key in kept_by_sites for key in ids], dtype=bool),
        core=np.array([core_of.get(node, -1) for node, _ in a.unf.sequence], dtype=np.int64),
    )
    return expand(table, fold_, whole) if fold_ is not whole else table


def _gathered_bytes(attention: fx.Node) -> int:
    """The keys' and values' bytes context parallelism gathers at `attention`: before a grouped-query
    expansion, as the pass gathers them (passes/context_parallel.py)."""
    from ..passes.context_parallel import head_repeat

    k, v = attention.args[1:3]
    ek, ev = head_repeat(k, attention), head_repeat(v, attention)
    repeats = ek.repeats if ek is not None and ev is not None and ek.repeats == ev.repeats else 1
    return sum(info(x).out_bytes for x in (k, v) if isinstance(x, fx.Node)) // repeats


def _gemm_dims(node: fx.Node, kind: OpKind) -> tuple[int, int]:
    """(K, N) of a linear or matmul as this rank runs it: its first operand's last dim, its output's; (0, 0)
    where either is not at least a matrix (a matrix-vector product prices at the profile's efficiency).
    A product added to a tensor (baddbmm) multiplies its second and third arguments."""
    at = 1 if kind == OpKind.ADD_MATMUL else 0
    first = node.args[at] if len(node.args) > at else None
    x = info(first).tensor if isinstance(first, fx.Node) else None
    out = info(node).tensor
    if x is None or out is None or len(x.shape) < 2 or len(out.shape) < 2:
        return 0, 0
    return int(x.shape[-1]), int(out.shape[-1])


def _operand_bytes(node: fx.Node, per_element: bool = False, shard: Any = False) -> int:
    """A linear's input and weight, as it reads them: what --fp8 casts to float8 first (`per_element`:
    their elements). `shard` given: a tensorwise float8 gathering linear's, which casts that shard
    (None: nothing, the first linear of its gather casts it) and its weight."""
    pair = (node.args[0], node.args[2]) if node.target is column_linear_from_seq_shard else node.args[:2]
    if shard is not False:
        pair = (shard, pair[1])
    operands = [x for x in pair if isinstance(x, fx.Node)]
    if not per_element:
        return sum(info(x).out_bytes for x in operands)
    return sum(info(x).out_bytes // max(info(x).tensor.dtype.itemsize, 1) for x in operands if info(x).tensor is not None)


def _fp8_weight(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The weight (its get_attr) of a linear --fp8 runs in float8 (passes/float8.py): an nn.Linear's weight
    in `F.linear` or in sequence parallelism's gathering linear, its two dims as this tp rank holds it
    multiples of 16; None for any other op."""
    from ..passes.tensor_parallel.spellings import linear_form

    if node.op == "call_function" and node.target is column_linear_from_seq_shard:  # sequence parallelism's
        weight = node.args[2]
    else:
        form = linear_form(node) if node.op == "call_function" and node.target in FP8_LINEARS else None
        weight = form[1] if form is not None else None
    while isinstance(weight, fx.Node) and weight.op == "call_method" and weight.target == "to":  # autocast's cast
        weight = weight.args[0]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    try:
        owner = gm.get_submodule(str(weight.target).rpartition(".")[0])
    except AttributeError:
        return None
    spec = info(weight).tensor
    ok = isinstance(owner, torch.nn.Linear) and spec is not None and len(spec.shape) == 2 \
        and all(int(d) % 16 == 0 for d in spec.shape)
    return weight if ok else None


def _fp8_linear(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether --fp8 runs this linear in float8 (passes/float8.py)."""
    return _fp8_weight(gm, node) is not None


FP8_LINEARS = (torch.nn.functional.linear, torch.ops.aten.linear.default)  # what passes/float8.py converts
