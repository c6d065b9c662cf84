"""The walk: ask each node's rule for a decision, then apply it; the pass itself.

One forward pass in graph order. Every tensor value gets a layout
(`NodeInfo.sharding`); a node's inputs are moved to the layouts its rule asks
for by `Redistribute` (the only place a collective is inserted), its
arguments are rewritten as the rule says, its parameters recorded as sharded.
Whole in, whole out is written once here, not in every rule; scalars only
matter to size queries.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch.fx as fx
import torch.nn as nn

from ...analysis.shapes import annotate
from ...errors import GraphsplitError
from ...ir.meta import info, insert_node, replace_node
from ...ir.op_kinds import OpKind, family
from ...ir.sharding import Partial, Replicate, Shard
from ...ops import tp as tpops
from ..functionalize import NORM_MODULES, functionalize_modules
from ..manager import PassInput, PassResults
from . import rules  # noqa: F401  (fills RULES)
from .decision import (
    COMM,
    OWNS_WEIGHTS,
    SELF,
    Call,
    Decision,
    LayoutView,
    Local,
    decide,
    replicated,
)
from .fuse_sums import fuse_partial_sums
from .redistribute import Redistribute
from .seq_linear import keep_shards_for_column_linears
from .spellings import describe, param_behind

R = Replicate()


def _walk(gm: fx.GraphModule, tp: int, sequence_parallel: bool = False) -> Walker:
    # one spelling of linears and embeddings, weights as graph values (and the norms' weights,
    # whose gradients sequence parallelism sums over the ranks)
    functionalize_modules(gm, (nn.Linear, nn.Embedding, *NORM_MODULES) if sequence_parallel else (nn.Linear, nn.Embedding))
    walker = Walker(gm, tp, sequence_parallel)
    walker.run()
    fuse_partial_sums(gm)  # parallel-residual blocks: one collective for the two row-parallel sums
    if sequence_parallel:
        keep_shards_for_column_linears(gm)  # column-parallel linears keep the tokens' shard for backward
    gm.graph.lint()
    gm.recompile()
    return walker


@dataclass(frozen=True)
class LeftWhole:
    """A node tensor parallelism left whole (or gathered a value for), and why."""

    module: str
    node: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"module": self.module, "node": self.node, "reason": self.reason}


@dataclass(frozen=True)
class TensorParallelResult:
    param_shardings: Mapping[str, Shard]  # canonical parameter name -> its sharding (absent: whole)
    left_whole: tuple[LeftWhole, ...]


def tensor_parallel_pass(
    gm: fx.GraphModule, inp: PassInput, done: PassResults
) -> tuple[fx.GraphModule, TensorParallelResult | None]:
    if inp.plan.tp == 1:
        return gm, None
    walker = _walk(gm, inp.plan.tp, inp.plan.sequence_parallel)
    # what one rank computes: local shapes, FLOPs and bytes
    annotate(gm, inp.example_inputs, param_shardings=walker.param_shardings, tp=inp.plan.tp)
    return gm, TensorParallelResult(MappingProxyType(dict(walker.param_shardings)), tuple(walker.left_whole))


def parallelize_loss(loss_gm: fx.GraphModule, tp: int, input_layouts: dict[int, Shard]) -> bool:
    """Rewrite a traced loss whose inputs `input_layouts` (placeholder index -> Shard) stay
    sharded; True if every sharded input is consumed without a gather (vocab-parallel CE)."""
    placeholders = [n for n in loss_gm.graph.nodes if n.op == "placeholder"]
    for i, layout in input_layouts.items():
        info(placeholders[i]).sharding = layout
    _walk(loss_gm, tp)
    calls = {n.target for n in loss_gm.graph.nodes if n.op == "call_function"}
    return tpops.vocab_parallel_cross_entropy in calls and tpops.gather_from_tp not in calls


class Walker:
    """Walks one graph (the model's or the loss's) for `tp` ranks; collects the parameter
    shardings it decided and what it left whole."""

    def __init__(self, gm: fx.GraphModule, tp: int, sequence_parallel: bool = False) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.tp = tp
        self.sequence_parallel = sequence_parallel
        self.param_shardings: dict[str, Shard] = {}
        self.left_whole: list[LeftWhole] = []
        self.read_whole: set[str] = set()  # parameters a decided node reads whole: never sharded after
        self.view = LayoutView(gm, tp, self.param_shardings, sequence_parallel)
        self.redistribute = Redistribute(gm, tp)

    def run(self) -> None:
        for node in list(self.graph.nodes):
            ni = info(node)
            if ni.value == "scalar" and node.op != "output":
                if family(node, self.gm) == OpKind.SHAPE:
                    self.apply(node, decide(node, self.view, OpKind.SHAPE))
                continue
            if node.op in ("placeholder", "get_attr"):
                if ni.sharding is None:
                    ni.sharding = R
                continue
            kind = family(node, self.gm)
            if kind.never_shards and all(self.view.layout(a).is_replicate() for a in node.all_input_nodes
                                         if info(a).value == "tensor"):
                ni.sharding = self.view.whole(node)
                continue
            self.apply(node, decide(node, self.view, kind))

    def apply(self, node: fx.Node, decision: Decision) -> None:
        """Carry out a rule's decision for `node`: the only graph edits the pass makes."""
        decision = self._reading_params_as_held(node, decision)
        if decision.reason:
            self.left_whole.append(LeftWhole(info(node).module or "<root>", node.name, decision.reason))
        for param, layout in decision.params:
            self._shard_param(param, layout)
        moved: dict[fx.Node, fx.Node] = {}
        for value, need in decision.inputs:
            current = moved.get(value, value)
            new = self.redistribute.to(current, need, node)
            if new is not current:
                node.replace_input_with(current, new)
                moved[value] = new
        if decision.edit is not None:
            node.target = decision.edit.target
            node.args = self._resolve(decision.edit.args, node, moved)
            node.kwargs = self._resolve(dict(decision.edit.kwargs), node, moved)
        if decision.swap is not None:
            node = replace_node(node, decision.swap.target, self._resolve(decision.swap.args, node, moved),
                                self._resolve(dict(decision.swap.kwargs), node, moved))
        if decision.out is not None:
            info(node).sharding = decision.out
        partial = isinstance(decision.out, Partial)
        if partial or decision.then is not None:
            users = list(node.users)
            # a partial sum is summed where it is made (Megatron's g): no consumer sees one
            reduced = self._reduce(node) if partial else node
            last = reduced
            if decision.then is not None:
                last = self._then(node, reduced, decision.then)
                if partial and isinstance(info(reduced).sharding, Shard):  # a bias on the tokens' shard
                    self.apply(last, decide(last, self.view, family(last, self.gm)))
            for user in users:
                user.replace_input_with(node, last)

    def _reduce(self, node: fx.Node) -> fx.Node:
        """The partial `node` summed over tp: all-reduced, or under sequence parallelism the output
        of a row-parallel layer over tokens ([..., s, h]) reduce-scattered along the sequence dim."""
        shape = self.view.shape(node)
        if not self.sequence_parallel or family(node, self.gm) != OpKind.LINEAR or shape is None or len(shape) < 3:
            return self.redistribute.reduce_after(node)
        seq = len(shape) - 2
        if shape[seq] % self.tp:
            raise GraphsplitError(
                f"sequence parallelism splits the sequence dim of '{info(node).module or '<root>'}' "
                f"(size {shape[seq]} in {list(shape)}) over tp={self.tp}, which does not divide it; give a "
                f"sequence length that is a multiple of {self.tp}, or drop --sequence-parallel"
            )
        return self.redistribute.reduce_scatter_after(node, seq)

    def _reading_params_as_held(self, node: fx.Node, decision: Decision) -> Decision:
        """`decision` with every parameter `node` reads in the layout the ranks hold it in.

        A parameter is held one way for all its uses: sharded by the first rule that shards it (a
        vocab-parallel embedding), and every other use (a tied LM head, `x @ wte.weight.t()`, a
        regularizer) reads those rows. Rules that propagate layouts read it as any value. A rule
        that owns its weight (`OWNS_WEIGHTS`: a linear) and left it out of its decision computed as
        if it were whole: it gets it gathered (Megatron's gather, whose gradient is this rank's
        rows). A rule that wants it sharded otherwise than it is held, or sharded where an earlier
        use read it whole, leaves the node whole instead."""
        claimed = dict(decision.params)
        for a, layout in claimed.items():
            given, name = self.view.param_layout(a), self.view.param_name(a)
            if (given is not None and given != layout) or (given is None and name in self.read_whole):
                held = f"held as {given}" if given is not None else "read whole by an earlier use"
                return replicated(node, self.view, f"{describe(node)} left whole: its parameter {name} is {held}")
        owns = family(node, self.gm) in OWNS_WEIGHTS
        asked = {value for value, _ in decision.inputs}
        missing = []
        if param_behind(node) is not None and node.op != "get_attr":
            return decision  # a cast of a parameter read by one op: that op's decision reads the parameter
        for a in node.all_input_nodes:
            param = param_behind(a)  # a parameter, read itself or through its casts
            name = self.view.param_name(param) if param is not None else None
            if name is None or param in claimed:
                continue
            if self.view.param_layout(param) is None:
                self.read_whole.add(name)
            elif owns and a not in asked:
                missing.append((a, R))
        return replace(decision, inputs=(*decision.inputs, *missing)) if missing else decision

    def _shard_param(self, node: fx.Node, layout: Shard) -> None:
        """Record the parameter `node` reads as sharded (every node reading that parameter, tied
        copies too, then has that layout), unless it already is otherwise."""
        name = self.view.param_name(node)
        if name is None or self.param_shardings.get(name, layout) != layout:
            return
        self.param_shardings[name] = layout
        for reader in self.graph.find_nodes(op="get_attr"):
            if self.view.param_name(reader) == name:
                info(reader).sharding = layout
                # and the casts a linear reads it through (`spellings.param_behind`), decided whole before
                cast = reader
                while len(cast.users) == 1 and param_behind(user := next(iter(cast.users))) is not None \
                        and user.args and user.args[0] is cast and family(user, self.gm) == OpKind.IDENTITY:
                    info(user).sharding = layout
                    cast = user

    def _then(self, node: fx.Node, value: fx.Node, call: Call) -> fx.Node:
        """`call` on `value` right after it, in `node`'s module: the value its users read."""
        args = tuple(value if a is SELF else a for a in self._resolve(call.args, node, {}))
        kwargs = self._resolve(dict(call.kwargs), node, {}) or None
        ni = info(node)
        if ni.value == "scalar":
            return insert_node(self.graph, call.target, args, after=value, owner=node, kind=OpKind.SHAPE,
                               value="scalar", kwargs=kwargs)
        return insert_node(self.graph, call.target, args, after=value, owner=node, kind=OpKind.OTHER,
                           tensor=ni.tensor, sharding=R, kwargs=kwargs)

    def _resolve(self, args: Any, at: fx.Node, moved: dict[fx.Node, fx.Node]) -> Any:
        """A rule's arguments as graph arguments: moved inputs, the communicator, local sizes."""

        def one(a: Any) -> Any:
            if isinstance(a, Local):
                return self._local_size(a.size, at, a.padded)
            if a is COMM:
                return self.redistribute.comm()
            if isinstance(a, fx.Node):
                return moved.get(a, a)
            return a

        return fx.node.map_aggregate(args, one)

    def _local_size(self, size: Any, at: fx.Node, padded: bool = False) -> Any:
        if isinstance(size, int):
            return size if size == -1 else -(-size // self.tp) if padded else size // self.tp
        if isinstance(size, fx.Node):
            if padded:  # ceil(size / tp): the padded block
                size = insert_node(self.graph, operator.add, (size, self.tp - 1), before=at, owner=at,
                                   kind=OpKind.SHAPE, value="scalar")
            return insert_node(self.graph, operator.floordiv, (size, self.tp), before=at, owner=at,
                               kind=OpKind.SHAPE, value="scalar")
        raise GraphsplitError(f"cannot rewrite the size {size!r} of {at.name} for tensor parallelism")
