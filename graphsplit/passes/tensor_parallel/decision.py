"""What a sharding rule reads and what it returns, and the table of rules.

A rule is a pure function `(node, view) -> Decision`, registered for one or more
op families (`OpKind`) with `@register`, as DTensor registers its op strategies.
It reads layouts, shapes and parameter shardings through the `LayoutView` and
never edits the graph; `walker.py` applies its decision, moving inputs to the
layouts the rule asks for through `redistribute.py`.

    @register(OpKind.SOFTMAX)
    def softmax(node, view):
        have = view.layout(node.args[0])
        if isinstance(have, Shard) and <softmax dim> != have.dim:
            return Decision(have)                 # keeps the shard, no collective
        return replicated(node, view, "softmax over the sharded dim")   # gather first

`x + b` with x: S(2) of [2, 4, 8] and b: R of [4, 1] decides
`Decision(out=Shard(dim=2), inputs=((b, BROADCAST),))` (tests/test_tp_rules.py
holds such rows for every family).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from ...ir.meta import canonical_names, info
from ...ir.op_kinds import OpKind
from ...ir.sharding import Layout, Replicate, Shard
from .layout import container_len, layout_of, shape_of
from .lookahead import heads_views
from .spellings import is_param, linear_form


class _Marker:
    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.__doc__ = doc

    def __repr__(self) -> str:
        return self.name


BROADCAST = _Marker(
    "BROADCAST",
    "A replicated input every rank reads whole while computing its shard of the output: "
    "unchanged forward, its gradient summed over tp in backward (Megatron's f, `copy_to_tp`). "
    "Asked of a value sharded on a dim (sequence parallelism's tokens before a column-parallel "
    "layer): all-gathered forward, its gradient reduce-scattered (`gather_for_column`).",
)
COMM = _Marker("COMM", "In a Call's arguments: the graph's communicator (`self.tp_comm`).")
SELF = _Marker("SELF", "In `Decision.then`'s arguments: the node's own (reduced) value.")

# what a rule may ask of an input: a layout, or BROADCAST
Need = Replicate | Shard | _Marker


@dataclass(frozen=True)
class Local:
    """A size argument that becomes this rank's size: an int // tp (-1 stays -1), a
    computed size // tp; `padded` (a dim tp does not divide): rounded up, ceil(size / tp)."""

    size: Any
    padded: bool = False


@dataclass(frozen=True)
class Call:
    """A call as data: target and arguments, which may hold `Local`, `COMM`, `SELF` and inputs."""

    target: Callable[..., Any] | str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """A rule's answer for one node.

    out: the node's layout (a tuple for a container; None: leave it undecided). A
    Partial output is reduced where it is made (Megatron's g), so no consumer sees one.
    inputs: (input, need) pairs, applied in order; chained needs of one input start
    from what the previous one made.
    params: (get_attr node, sharding) for the parameters the node shards; a parameter
    already sharded otherwise keeps its sharding.
    edit: the node's own new target and arguments (local sizes, no bias).
    swap: a call that replaces the node (embedding -> vocab_parallel_embedding).
    then: a call on the node's (reduced) value that its users read instead (the
    row-parallel bias added after the sum, a size answered globally).
    reason: why something stays whole, for the report.
    """

    out: Layout | tuple[Layout, ...] | None
    inputs: tuple[tuple[fx.Node, Need], ...] = ()
    params: tuple[tuple[fx.Node, Shard], ...] = ()
    edit: Call | None = None
    swap: Call | None = None
    then: Call | None = None
    reason: str | None = None


class LayoutView:
    """What rules may read: layouts decided so far, global shapes, parameter shardings."""

    def __init__(self, gm: fx.GraphModule, tp: int, param_shardings: Mapping[str, Shard] | None = None,
                 sequence_parallel: bool = False) -> None:
        self.gm = gm
        self.tp = tp
        # row-parallel sums left split on the sequence dim, the tokens gathered before column-parallel layers
        self.sequence_parallel = sequence_parallel
        self.param_shardings: Mapping[str, Shard] = param_shardings if param_shardings is not None else {}
        self.canonical = canonical_names(gm)
        # the most heads any view splits a feature dim into: the query heads, which must divide
        self.max_heads = max(heads_views(gm.graph), default=0)
        self.linear_weights = {
            self.param_name(form[1]) for n in gm.graph.nodes if (form := linear_form(n)) is not None
        } - {None}

    def layout(self, value: Any) -> Layout:
        return layout_of(value)

    def shape(self, value: Any) -> tuple[int, ...] | None:
        return shape_of(value)

    def param_name(self, node: Any) -> str | None:
        """The canonical name of the parameter a get_attr node reads (one name per tied parameter)."""
        if not isinstance(node, fx.Node) or node.op != "get_attr" or not is_param(self.gm, node):
            return None
        return self.canonical.get(id(self.gm.get_parameter(str(node.target))))

    def param_layout(self, node: Any) -> Shard | None:
        """The sharding already given to the parameter `node` reads (None: not sharded yet)."""
        return self.param_shardings.get(self.param_name(node) or "")

    def whole(self, node: fx.Node) -> Layout | tuple[Layout, ...]:
        """The replicated layout of `node`'s output: R, or R for each element of a container."""
        return (Replicate(),) * container_len(node) if info(node).value == "container" else Replicate()

    def sharded_inputs(self, node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if info(a).value == "tensor" and not self.layout(a).is_replicate()]


Rule = Callable[[fx.Node, LayoutView], Decision]
RULES: dict[OpKind, Rule] = {}

# The families whose rules carry a padded shard (`Shard(d, size=n)`) correctly: they never
# mix entries along the sharded dim, so the padding stays padding, or (cross-entropy, the
# output) they mask or cut it. Any other op would read the padding as data (a sum or a
# softmax over the vocabulary, a linear over it) or could turn its zeros into inf or nan
# whose gradient reaches real entries: it gets the value whole, the padding cut off.
PADDING_SAFE = frozenset({
    OpKind.IDENTITY, OpKind.VIEW, OpKind.SHAPE, OpKind.TRANSPOSE, OpKind.GETITEM, OpKind.SLICE,
    OpKind.CROSS_ENTROPY, OpKind.OUTPUT,
})


# The families whose rules carry a shard of chunks (`Shard(d, chunks)`: a fused QKV's features, or
# the heads inside a merged (batch x heads) dim, DTensor's strided shard) as chunks, never as a
# plain block: any other op gets the value whole, gathered and put back in order.
CHUNK_SAFE = frozenset({
    OpKind.IDENTITY, OpKind.VIEW, OpKind.TRANSPOSE, OpKind.POINTWISE, OpKind.GETITEM, OpKind.SLICE,
    OpKind.SPLIT, OpKind.EXPAND, OpKind.SOFTMAX, OpKind.REDUCTION, OpKind.LINEAR, OpKind.GROUPED_LINEAR,
    OpKind.MATMUL, OpKind.ADD_MATMUL, OpKind.FUNCTION, OpKind.EINSUM,
    OpKind.SHAPE, OpKind.OUTPUT,
})


# The families whose rules read their weights' layouts through `LayoutView.param_layout` (and
# decide to shard them with `Decision.params`) rather than as values: where such a rule leaves a
# weight that is held sharded (for a tied use) out of its decision, it computed as if the weight
# were whole, and the walker gathers it. Every other rule reads a parameter's layout as any value's.
OWNS_WEIGHTS = frozenset({OpKind.LINEAR, OpKind.EMBEDDING, OpKind.GROUPED_LINEAR})


def register(*kinds: OpKind) -> Callable[[Rule], Rule]:
    """Make the decorated function the rule of these op families."""

    def add(rule: Rule) -> Rule:
        for kind in kinds:
            if kind in RULES:
                raise ValueError(f"{kind} already has the rule {RULES[kind].__name__}")
            RULES[kind] = rule
        return rule

    return add


def decide(node: fx.Node, view: LayoutView, kind: OpKind) -> Decision:
    """The rule of `kind` for `node`; a value with padding rows (a vocabulary tp does not
    divide) reaches only the rules that keep its padding apart (`PADDING_SAFE`), a value sharded
    chunk by chunk only those that keep its chunks (`CHUNK_SAFE`). A padded
    parameter read by a linear or an embedding is that rule's to shard alike or gather."""
    def padded(a: fx.Node) -> bool:
        if a.op == "get_attr" and kind in (OpKind.LINEAR, OpKind.EMBEDDING):
            return False
        return isinstance(s := view.layout(a), Shard) and s.padded

    if kind not in PADDING_SAFE and any(padded(a) for a in node.all_input_nodes):
        return replicated(node, view, "reads a vocabulary tp does not divide as data: gathered, padding cut off")
    if kind not in CHUNK_SAFE and any(isinstance(s := view.layout(a), Shard) and s.chunks for a in node.all_input_nodes):
        return replicated(node, view, "reads a value sharded chunk by chunk: gathered, put back in order")
    return RULES.get(kind, RULES[OpKind.OTHER])(node, view)


def replicated(node: fx.Node, view: LayoutView, reason: str) -> Decision:
    """Every sharded tensor input made whole first; the output is whole: always correct."""
    return Decision(view.whole(node), inputs=tuple((a, Replicate()) for a in view.sharded_inputs(node)), reason=reason)
