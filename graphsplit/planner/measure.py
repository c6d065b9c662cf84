"""One compile of the folded graph, measured and seen as the whole op sequence.

`saved_by_node` runs the compiled graph on meta under saved-tensor hooks: what each op keeps
for backward (storages, parameters excluded) and what selective checkpointing keeps of its
outputs. `measure` turns that and the graph's annotations into arrays over the unfolded
sequence (fold.Unfolding): FLOPs, bytes moved, output bytes, bytes live across each cut.
`FusedAttention` prices attention's memory as a GPU's fused kernel keeps it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.utils._pytree import tree_map_only

from ..analysis.fused_attention import FusedAttention
from ..analysis.memory import KeptOutputs
from ..analysis.recompute import recomputable
from ..analysis.shapes import meta_copy
from ..ir.devices import meta_sizes
from ..ir.meta import info
from ..ops.activation_checkpoint import ATTENTION_KEEPS
from .fold import Fold, Unfolding


@dataclass
class KeptByNode:
    """What each node keeps for backward; what selective checkpointing keeps of its outputs, of those its
    attention's, and how many matmul calls it makes; the node whose output each kept storage is."""

    kept: dict[str, list[tuple[str, int, int]]]
    selective: dict[str, int]
    makers: dict[tuple[str, int], str]
    attention: dict[str, int]
    matmuls: dict[str, int]


def saved_by_node(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], shardings: dict[str, Any], tp: int,
                  fused_attention: bool = False) -> KeptByNode:
    """What each node keeps for backward, as (the node that first kept the storage, its index among the
    storages that node first kept, bytes): one entry per distinct storage, parameters excluded; the
    bytes of the outputs selective checkpointing would keep of each node (its matmul-class aten ops);
    and the node whose output each kept storage is, by (first keeper, index), where one is.
    Measured on meta with saved_tensors_hooks and KeptOutputs, as analysis/memory.py measures a stage."""
    module = meta_copy(gm, shardings, tp)
    params = {p.untyped_storage()._cdata for p in module.parameters()}
    first: dict[int, tuple[str, int, int]] = {}
    counts: dict[str, int] = {}
    kept: dict[str, list[tuple[str, int, int]]] = {}
    selective: dict[str, int] = {}
    attention_bytes: dict[str, int] = {}  # of those, attention's outputs
    matmuls: dict[str, int] = {}  # the matmul calls each node makes (selective:K keeps one in K)
    noted: set[int] = set()
    current = [""]
    made: dict[int, str] = {}  # storage -> the node whose output it is
    makers: dict[tuple[str, int], str] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata in params:
            return t
        key = first.get(storage._cdata)
        if key is None:
            index = counts.get(current[0], 0)
            counts[current[0]] = index + 1
            key = first[storage._cdata] = (current[0], index, storage.nbytes())
            if storage._cdata in made:
                makers[key[:2]] = made[storage._cdata]
        mine = kept.setdefault(current[0], [])
        if key not in mine:
            mine.append(key)
        return t

    alive: list[Any] = []  # a storage freed mid-run would hand its address to the next one

    def note(t: torch.Tensor, into: tuple[dict[str, int], ...] = (selective,)) -> None:
        storage = t.untyped_storage()
        if storage._cdata not in noted:
            noted.add(storage._cdata)
            alive.append(storage)
            for found in into:
                found[current[0]] = found.get(current[0], 0) + storage.nbytes()

    def on_keep(op: Any, out: Any) -> None:
        if op in ATTENTION_KEEPS:
            tree_map_only(torch.Tensor, lambda t: note(t, (selective, attention_bytes)), out)
        else:
            matmuls[current[0]] = matmuls.get(current[0], 0) + 1
            tree_map_only(torch.Tensor, note, out)

    class Run(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            current[0] = n.name
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                alive.append(out)  # its storage's address stays its own while the run lasts
                made.setdefault(out.untyped_storage()._cdata, n.name)
            return out

    args = tuple(torch.empty(t.shape, dtype=t.dtype, device="meta", requires_grad=t.is_floating_point())
                 for t in inputs)
    outputs = KeptOutputs(note, on_keep)
    outputs.enter()
    # on_meta: the ATen op an exported graph calls is attention as a GPU runs it too, not only the
    # functional call a torch.fx graph makes (the math path keeps the sequence x sequence probabilities)
    attention = FusedAttention(on_meta=True) if fused_attention else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), outputs, attention:
        with meta_sizes():  # sizes that follow the data at their largest
            Run(module).run(*args)
    return KeptByNode(kept, selective, makers, attention_bytes, matmuls)


def node_params(gm: fx.GraphModule, node: fx.Node, names: dict[int, str], recomp: set[fx.Node],
                 memo: dict[fx.Node, tuple[str, ...]]) -> tuple[str, ...]:
    """The parameters a stage holding `node` must hold: those it reads, and those behind the values it
    recomputes for itself (a weight's bf16 cast made before the cut is made again after it)."""
    if node in memo:
        return memo[node]
    found: list[str] = []
    for a in node.all_input_nodes:
        if a.op == "get_attr":
            try:
                found.append(names[id(gm.get_parameter(str(a.target)))])
            except (AttributeError, KeyError):
                pass
        elif a in recomp:
            found += node_params(gm, a, names, recomp, memo)
    if node.op == "call_module":
        found += [names[id(p)] for p in gm.get_submodule(str(node.target)).parameters() if id(p) in names]
    memo[node] = tuple(dict.fromkeys(found))
    return memo[node]


@dataclass
class Measured:
    """One compile of one variant at one micro-batch size, seen as the whole op sequence."""

    unf: Unfolding
    gm: fx.GraphModule
    shardings: dict[str, Any]
    flops: np.ndarray
    bytes: np.ndarray
    out: np.ndarray
    live: np.ndarray
    blocked: np.ndarray
    kept: list[list[tuple[tuple[str, int, int], int]]]  # per op: (storage key, bytes) of what it keeps
    makers: dict[tuple[str, int, int], str]  # storage key -> the node (of the compiled graph) that made it
    selective: np.ndarray  # per op: what selective checkpointing keeps of its outputs
    selective_attention: np.ndarray  # per op: of those, its attention's outputs
    matmul_calls: np.ndarray  # per op: the matmul calls it makes (selective:K keeps one in K)
    # storage key -> where in the sequence the op that made it is (its output), where that is known
    maker_pos: dict[tuple[str, int, int], int] = field(default_factory=dict)


def measure(gm: fx.GraphModule, shardings: dict[str, Any], fold_: Fold | None, tp: int,
             inputs: tuple[torch.Tensor, ...], fused_attention: bool) -> Measured:
    """`gm` (compiled and annotated at `inputs`) seen as the whole op sequence."""
    found = saved_by_node(gm, inputs, shardings, tp, fused_attention)
    saved, selective, made_by = found.kept, found.selective, found.makers
    unf = Unfolding(gm, fold_)
    by_name = {n.name: n for n in gm.graph.nodes}
    n = len(unf)
    live = np.zeros(n + 2, dtype=np.int64)
    blocked = np.zeros(n + 2, dtype=np.int64)
    size = out_bytes(gm)
    for node, _copy, start, end in unf.intervals(recomputable(gm.graph)):
        ni = info(node)
        if ni.value == "tensor":
            live[start] += size[node]
            live[end + 1] -= size[node]
        elif ni.value == "container":
            blocked[start] += 1
            blocked[end + 1] -= 1
    kept = []
    makers: dict[tuple[str, int, int], str] = {}
    maker_pos: dict[tuple[str, int, int], int] = {}
    for op in unf.sequence:
        mine = []
        for first, index, nbytes in saved.get(op[0].name, []):
            source, copy_ = unf.value(by_name[first], op) if first in by_name else (None, 0)
            key = (source.name if source is not None else first, copy_, index)
            mine.append((key, nbytes))
            if (first, index) in made_by:
                makers[key] = made_by[(first, index)]
                maker = by_name.get(makers[key])
                if maker is not None and key not in maker_pos:
                    maker_pos[key] = unf.position.get(unf.value(maker, op), -1)
        kept.append(mine)
    ops = [node for node, _ in unf.sequence]
    return Measured(
        unf=unf, gm=gm, shardings=shardings,
        flops=np.array([info(x).flops for x in ops], dtype=np.int64),
        bytes=np.array([info(x).bytes_moved for x in ops], dtype=np.int64),
        out=np.array([size[x] for x in ops], dtype=np.int64),
        live=np.cumsum(live)[: n + 1], blocked=np.cumsum(blocked)[: n + 1] > 0, kept=kept, makers=makers,
        maker_pos=maker_pos,
        selective=np.array([selective.get(x.name, 0) for x in ops], dtype=np.int64),
        selective_attention=np.array([found.attention.get(x.name, 0) for x in ops], dtype=np.int64),
        matmul_calls=np.array([found.matmuls.get(x.name, 0) for x in ops], dtype=np.int64),
    )


def out_bytes(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """Each node's output bytes, computed once (the unfolded sequence reads each node hundreds of times)."""
    return {node: info(node).out_bytes for node in gm.graph.nodes}
