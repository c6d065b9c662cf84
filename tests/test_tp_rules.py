"""The tensor-parallel sharding rules as tables, without tracing a model.

Each row builds a small fx graph by hand (nodes annotated with global shapes and
input layouts, as the meta analysis and the walk leave them), asks the node's rule
for its decision and compares it with the expected one. Then the walker and the
redistribute step on hand-built graphs: which collectives, and that one is reused.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graphsplit.ir.meta import TensorSpec, info
from graphsplit.ir.op_kinds import OpKind, family
from graphsplit.ir.sharding import P, R, S, Shard, local_shape, real_rows, shard_tensor, unpad
from graphsplit.ops import tp as tpops
from graphsplit.passes.tensor_parallel.decision import (
    BROADCAST,
    COMM,
    RULES,
    SELF,
    Decision,
    LayoutView,
    Local,
    decide,
)
from graphsplit.passes.tensor_parallel.walker import Walker


class G:
    """A graph built node by node; every tensor node carries its global shape."""

    def __init__(self) -> None:
        self.root = nn.Module()
        self.graph = fx.Graph()

    def input(self, name: str, shape: tuple[int, ...], layout: Any = None, grad: bool = True,
              dtype: torch.dtype = torch.float32) -> fx.Node:
        node = self.graph.placeholder(name)
        self._annotate(node, shape, grad, dtype)
        info(node).sharding = layout
        return node

    def param(self, name: str, shape: tuple[int, ...]) -> fx.Node:
        self.root.register_parameter(name, nn.Parameter(torch.empty(shape, device="meta")))
        node = self.graph.get_attr(name)
        self._annotate(node, shape, True, torch.float32)
        return node

    def call(self, target: Callable[..., Any] | str, *args: Any, shape: tuple[int, ...] | None = None,
             value: str = "tensor", **kwargs: Any) -> fx.Node:
        op = "call_method" if isinstance(target, str) else "call_function"
        node = self.graph.create_node(op, target, args, kwargs)
        if shape is not None:
            self._annotate(node, shape, True, torch.float32)
        info(node).value = value
        return node

    def module(self) -> fx.GraphModule:
        if not any(n.op == "output" for n in self.graph.nodes):
            self.graph.output(list(self.graph.nodes)[-1])
        return fx.GraphModule(self.root, self.graph)

    def decide(self, node: fx.Node, tp: int = 2) -> Decision:
        gm = self.module()
        return decide(node, LayoutView(gm, tp), family(node, gm))  # as the walker asks

    @staticmethod
    def _annotate(node: fx.Node, shape: tuple[int, ...], grad: bool, dtype: torch.dtype) -> None:
        ni = info(node)
        ni.value, ni.tensor = "tensor", TensorSpec(shape, dtype, grad)


def names(pairs: tuple[tuple[fx.Node, Any], ...]) -> list[tuple[str, Any]]:
    return [(n.name, need) for n, need in pairs]


# --- rule tables -------------------------------------------------------------------------------
# (case, build(g) -> node, expected out, expected inputs [(name, need)], reason fragment or None)

def _add_broadcast(g: G) -> fx.Node:
    x, b = g.input("x", (2, 4, 8), S(2)), g.input("b", (4, 1), R)  # broadcast along the sharded dim
    return g.call(operator.add, x, b, shape=(2, 4, 8))


def _add_bias(g: G) -> fx.Node:
    x, b = g.input("x", (2, 4, 8), S(2)), g.input("b", (8,), R)
    return g.call(operator.add, x, b, shape=(2, 4, 8))


def _add_full(g: G) -> fx.Node:
    x, y = g.input("x", (2, 4, 8), S(2)), g.input("y", (2, 4, 8), R)
    return g.call(operator.add, x, y, shape=(2, 4, 8))


def _add_mixed(g: G) -> fx.Node:
    x, y = g.input("x", (2, 4, 8), S(1)), g.input("y", (2, 4, 8), S(2))
    return g.call(operator.mul, x, y, shape=(2, 4, 8))


def _add_fused_and_whole(g: G) -> fx.Node:
    x, y = g.input("x", (2, 4, 24), S(2, (8, 8, 8))), g.input("y", (2, 4, 24), R)
    return g.call(operator.add, x, y, shape=(2, 4, 24))


def _detach(g: G) -> fx.Node:
    return g.call("detach", g.input("x", (2, 4, 8), S(1, (2, 2))), shape=(2, 4, 8))


def _view_heads(g: G) -> fx.Node:
    return g.call("view", g.input("x", (2, 4, 8), S(2)), 2, 4, 2, 4, shape=(2, 4, 2, 4))


def _view_moves_shard(g: G) -> fx.Node:
    return g.call("view", g.input("x", (2, 4, 6), S(1)), 2, 3, 8, shape=(2, 3, 8))


def _view_reblocks_shard(g: G) -> fx.Node:
    # each rank's 2 rows of 6 are 3 rows of 4: still one block of the output's rows, not a factor of them
    return g.call("view", g.input("x", (4, 6), S(0)), 6, 4, shape=(6, 4))


def _view_merges_shard(g: G) -> fx.Node:
    # (batch, heads) merged: each rank's heads of every example, chunks of the merged dim
    return g.call("view", g.input("x", (2, 4, 8), S(1)), 8, 8, shape=(8, 8))


def _view_unmerges_shard(g: G) -> fx.Node:
    return g.call("view", g.input("x", (8, 5), S(0, (4, 4))), 2, 4, 5, shape=(2, 4, 5))


def _transpose(g: G) -> fx.Node:
    return g.call("transpose", g.input("x", (2, 4, 8), S(2)), 1, 2, shape=(2, 8, 4))


def _permute(g: G) -> fx.Node:
    return g.call("permute", g.input("x", (2, 4, 8, 3), S(1)), 0, 2, 1, 3, shape=(2, 8, 4, 3))


def _softmax_other(g: G) -> fx.Node:
    return g.call(F.softmax, g.input("x", (2, 4, 8), S(1)), -1, shape=(2, 4, 8))


def _softmax_sharded(g: G) -> fx.Node:
    return g.call(F.softmax, g.input("x", (2, 4, 8), S(2)), -1, shape=(2, 4, 8))


def _sum_other(g: G) -> fx.Node:
    return g.call("sum", g.input("x", (2, 4, 8), S(2)), 1, shape=(2, 8))


def _sum_sharded(g: G) -> fx.Node:
    return g.call("sum", g.input("x", (2, 4, 8), S(2)), 2, shape=(2, 4))


def _layer_norm(g: G) -> fx.Node:
    return g.call(F.layer_norm, g.input("x", (2, 4, 8), S(2)), (8,), shape=(2, 4, 8))


def _cat_other(g: G) -> fx.Node:
    x, y = g.input("x", (2, 4, 8), S(2)), g.input("y", (2, 4, 8), S(2))
    return g.call(torch.cat, [x, y], 1, shape=(2, 8, 8))


def _cat_sharded(g: G) -> fx.Node:
    x, y = g.input("x", (2, 4, 8), S(2)), g.input("y", (2, 4, 8), S(2))
    return g.call(torch.cat, [x, y], 2, shape=(2, 4, 16))


def _stack(g: G) -> fx.Node:
    x, y = g.input("x", (2, 4, 8), S(1)), g.input("y", (2, 4, 8), S(1))
    return g.call(torch.stack, [x, y], 0, shape=(2, 2, 4, 8))


def _index_keeps(g: G) -> fx.Node:
    return g.call(operator.getitem, g.input("x", (2, 4, 8), S(2)), (slice(None), 0), shape=(2, 8))


def _index_sharded(g: G) -> fx.Node:
    return g.call(operator.getitem, g.input("x", (2, 4, 8), S(2)), (Ellipsis, 0), shape=(2, 4))


def _matmul_batch(g: G) -> fx.Node:
    a, b = g.input("a", (2, 4, 8, 16), S(1)), g.input("b", (2, 4, 16, 8), S(1))
    return g.call(torch.matmul, a, b, shape=(2, 4, 8, 8))


def _matmul_batch_whole_other(g: G) -> fx.Node:
    a, b = g.input("a", (2, 4, 8, 16), S(1)), g.input("b", (2, 4, 16, 8), R)
    return g.call(torch.matmul, a, b, shape=(2, 4, 8, 8))


def _matmul_contracted(g: G) -> fx.Node:
    a, b = g.input("a", (8, 16), S(1)), g.input("b", (16, 4), S(0))
    return g.call(torch.matmul, a, b, shape=(8, 4))


def _attention(g: G) -> fx.Node:
    q, k = g.input("q", (2, 4, 16, 8), S(1)), g.input("k", (2, 4, 16, 8), R)
    v = g.input("v", (2, 4, 16, 8), S(1))
    return g.call(F.scaled_dot_product_attention, q, k, v, shape=(2, 4, 16, 8))


def _attention_odd_heads(g: G) -> fx.Node:
    q, k = g.input("q", (2, 4, 16, 8), S(1)), g.input("k", (2, 3, 16, 8), R)
    v = g.input("v", (2, 4, 16, 8), S(1))
    return g.call(F.scaled_dot_product_attention, q, k, v, shape=(2, 4, 16, 8))


def _baddbmm_heads(g: G) -> fx.Node:
    # BLOOM's scores: ALiBi's bias (batch x heads, 1, keys) added to q @ k^T over a merged batch x heads dim
    bias = g.input("bias", (8, 1, 16), R, grad=False)
    q, k = g.input("q", (8, 16, 4), S(0, (4, 4))), g.input("k", (8, 4, 16), S(0, (4, 4)))
    return g.call(torch.baddbmm, bias, q, k, shape=(8, 16, 16))


def _baddbmm_broadcast(g: G) -> fx.Node:
    bias = g.input("bias", (1, 16, 16), R)
    q, k = g.input("q", (8, 16, 4), S(0)), g.input("k", (8, 4, 16), S(0))
    return g.call(torch.baddbmm, bias, q, k, shape=(8, 16, 16))


def _baddbmm_contracted(g: G) -> fx.Node:
    bias = g.input("bias", (2, 8, 4), R)
    a, b = g.input("a", (2, 8, 16), S(2)), g.input("b", (2, 16, 4), S(1))
    return g.call(torch.baddbmm, bias, a, b, shape=(2, 8, 4))


def _addbmm(g: G) -> fx.Node:
    bias = g.input("bias", (8, 4), R)
    a, b = g.input("a", (2, 8, 16), S(0)), g.input("b", (2, 16, 4), S(0))
    return g.call(torch.addbmm, bias, a, b, shape=(8, 4))


class _Gelu(torch.autograd.Function):
    """BLOOM's GeLUFunction's shape: elementwise forward, elementwise backward from the saved input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(1.702 * x) + y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(1.702 * x)
        return grad * (s + 1.702 * x * s * (1 - s)), grad


class _RowNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True) + y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad


class _NormedGradient(torch.autograd.Function):
    """Elementwise forward, but its backward scales the gradient by its norm over the whole tensor."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad / grad.norm(), grad


def _function(cls: type) -> Callable[[G], fx.Node]:
    from graphsplit.ir.autograd_functions import FunctionCall

    def build(g: G) -> fx.Node:
        x, y = g.input("x", (2, 4, 8), S(2)), g.input("y", (2, 4, 8), R)
        return g.call(FunctionCall(cls), x, y, shape=(2, 4, 8))
    return build


def _einsum_heads(g: G) -> fx.Node:
    # Time-Series-Library's scores over sharded heads: h kept, e summed
    q, k = g.input("q", (2, 8, 4, 16), S(2)), g.input("k", (2, 8, 4, 16), R)
    return g.call(torch.einsum, "blhe,bshe->bhls", q, k, shape=(2, 4, 8, 8))


def _einsum_spaced_broadcast(g: G) -> fx.Node:
    # x-transformers' spelling, a shared key broadcast over the heads
    q, k = g.input("q", (2, 4, 8, 16), S(1)), g.input("k", (2, 8, 16), R)
    return g.call(torch.einsum, "b h i d, b j d -> b h i j", q, k, shape=(2, 4, 8, 8))


def _einsum_merged_heads(g: G) -> fx.Node:
    # einops' `(b h) n d` then `einsum("b i d, b j d -> b i j")`: each rank's heads of every sample, kept
    q, k = g.input("q", (8, 6, 4), S(0, (4, 4))), g.input("k", (8, 5, 4), S(0, (4, 4)))
    return g.call(torch.einsum, "abc,adc->abd", q, k, shape=(8, 6, 5))


def _einsum_contracted(g: G) -> fx.Node:
    a, b = g.input("a", (8, 16), S(1)), g.input("b", (16, 4), R)
    return g.call(torch.einsum, "ik,kj->ij", a, b, shape=(8, 4))


def _einsum_two_letters(g: G) -> fx.Node:
    a, b = g.input("a", (8, 16), S(0)), g.input("b", (16, 4), S(1))
    return g.call(torch.einsum, "ik,kj->ij", a, b, shape=(8, 4))


def _unknown(g: G) -> fx.Node:
    return g.call(torch.cumsum, g.input("x", (2, 4, 8), S(2)), 2, shape=(2, 4, 8))


RULE_ROWS = [
    ("add: broadcast operand read whole", _add_broadcast, S(2), [("b", BROADCAST)], None),
    ("add: whole operand scattered", _add_full, S(2), [("y", S(2))], None),
    ("add: whole bias scattered", _add_bias, S(2), [("b", S(0))], None),
    ("mul: shards on different dims", _add_mixed, R, [("x", R), ("y", R)], "different dims"),
    ("add: whole value cut chunk by chunk", _add_fused_and_whole, S(2, (8, 8, 8)), [("y", S(2, (8, 8, 8)))], None),
    ("detach keeps a fused shard", _detach, S(1, (2, 2)), [], None),
    ("view splitting the sharded dim", _view_heads, S(2), [], None),
    ("view breaking the shard's blocks", _view_moves_shard, R, [("x", R)], "moves the sharded dim 1"),
    ("view re-cutting the sharded dim's blocks", _view_reblocks_shard, S(0), [], None),
    ("view merging the sharded dim into the one before", _view_merges_shard, S(0, (4, 4)), [], None),
    ("view splitting a merged dim back", _view_unmerges_shard, S(1), [], None),
    ("transpose", _transpose, S(1), [], None),
    ("permute", _permute, S(2), [], None),
    ("softmax over another dim", _softmax_other, S(1), [], None),
    ("softmax over the sharded dim", _softmax_sharded, R, [("x", R)], "over the sharded dim"),
    ("sum over another dim", _sum_other, S(1), [], None),
    ("sum over the sharded dim", _sum_sharded, R, [("x", R)], "reduces over the sharded dim"),
    ("layer norm", _layer_norm, R, [("x", R)], "normalizes over the sharded dim"),
    ("cat along another dim", _cat_other, S(2), [], None),
    ("cat along the sharded dim", _cat_sharded, R, [("x", R), ("y", R)], "concatenates along the sharded dim"),
    ("stack", _stack, S(2), [], None),
    ("indexing another dim", _index_keeps, S(1), [], None),
    ("indexing the sharded dim", _index_sharded, R, [("x", R)], "along its sharded dim"),
    ("matmul over sharded batches", _matmul_batch, S(1), [], None),
    ("matmul: whole operand takes the batch shard", _matmul_batch_whole_other, S(1), [("b", S(1))], None),
    ("matmul over the sharded inner dim", _matmul_contracted, P, [], None),
    ("attention over sharded heads", _attention, S(1), [("k", S(1))], None),
    ("attention: heads that do not divide", _attention_odd_heads, R, [("q", R), ("v", R)], "3 heads not divisible"),
    ("baddbmm: the bias cut as the merged heads", _baddbmm_heads, S(0, (4, 4)), [("bias", S(0, (4, 4)))], None),
    ("baddbmm: a bias broadcast along the shard", _baddbmm_broadcast, S(0), [("bias", BROADCAST)], None),
    ("baddbmm over the sharded inner dim", _baddbmm_contracted, R, [("a", R), ("b", R)], "partial product"),
    ("addbmm sums over the batch", _addbmm, R, [("a", R), ("b", R)], "is not known to keep a shard"),
    ("an elementwise autograd Function", _function(_Gelu), S(2), [("y", S(2))], None),
    ("an autograd Function normalizing the shard", _function(_RowNorm), R, [("x", R)], "custom autograd Function"),
    ("an autograd Function whose backward mixes", _function(_NormedGradient), R, [("x", R)], "custom autograd Function"),
    ("einsum keeps the heads' letter", _einsum_heads, S(1), [("k", S(2))], None),
    ("einsum: an operand without the letter read whole", _einsum_spaced_broadcast, S(1), [("k", BROADCAST)], None),
    ("einsum over merged batch x heads chunks", _einsum_merged_heads, S(0, (4, 4)), [], None),
    ("einsum summing the sharded letter", _einsum_contracted, P, [("b", S(0))], None),
    ("einsum cut along two letters", _einsum_two_letters, R, [("a", R), ("b", R)], "different letters"),
    ("an op no rule knows", _unknown, R, [("x", R)], "is not known to keep a shard"),
]


@pytest.mark.parametrize("case, build, out, inputs, reason", RULE_ROWS, ids=[r[0] for r in RULE_ROWS])
def test_rule_table(case, build, out, inputs, reason):
    g = G()
    decision = g.decide(build(g))
    assert decision.out == out
    assert names(decision.inputs) == inputs
    if reason is None:
        assert decision.reason is None
    else:
        assert reason in decision.reason
    assert not decision.params and decision.swap is None and decision.then is None


# --- rules that rewrite arguments, shard parameters or replace the op ---------------------------

def test_view_size_argument_becomes_local():
    g = G()
    decision = g.decide(_view_heads(g))
    assert decision.edit.target == "view"
    assert decision.edit.args[1:] == (2, 4, Local(2), 4)  # 2 heads of 4 -> 1 per rank


def test_fused_split_into_its_chunks_gets_local_sizes():
    g = G()
    x = g.input("x", (2, 4, 24), S(2, (8, 8, 8)))
    parts = g.call("split", x, 8, dim=2, value="container")
    for i in range(3):
        g.call(operator.getitem, parts, i, shape=(2, 4, 8))
    decision = g.decide(parts)
    assert decision.out == (S(2),) * 3  # each rank's part of q, k and v
    assert decision.edit.args == (x, 4)


def test_expand_size_of_the_sharded_dim_becomes_local():
    g = G()
    x = g.input("x", (2, 4, 1), S(1))
    decision = g.decide(g.call("expand", x, 2, 4, 8, shape=(2, 4, 8)))
    assert decision.out == S(1) and decision.edit.args == (x, 2, Local(4), 8)


def _mlp(g: G, then_norm: bool = False) -> tuple[fx.Node, fx.Node, dict[str, fx.Node]]:
    x = g.input("x", (2, 4, 8), R)
    w1, b1, w2, b2 = g.param("w1", (16, 8)), g.param("b1", (16,)), g.param("w2", (8, 16)), g.param("b2", (8,))
    up = g.call(F.linear, x, w1, b1, shape=(2, 4, 16))
    act = g.call(F.gelu, up, shape=(2, 4, 16))
    if then_norm:
        act = g.call(F.layer_norm, act, (16,), shape=(2, 4, 16))
    down = g.call(F.linear, act, w2, b2, shape=(2, 4, 8))
    return up, down, {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2, "act": act}


def test_linear_with_whole_input_is_column_parallel():
    g = G()
    up, _, n = _mlp(g)
    decision = g.decide(up)
    assert decision.out == S(2)
    assert names(decision.inputs) == [("x", BROADCAST)]  # f: the input's gradient summed over tp
    assert decision.params == ((n["w1"], Shard(0)), (n["b1"], Shard(0)))


def test_linear_with_feature_sharded_input_is_row_parallel_with_the_bias_after_the_sum():
    g = G()
    _, down, n = _mlp(g)
    info(n["act"]).sharding = S(2)
    decision = g.decide(down)
    assert decision.out == P  # the walker sums it right after
    assert decision.params == ((n["w2"], Shard(1)),)
    assert decision.edit.args == (n["act"], n["w2"])  # no bias in the local product
    assert decision.then.target is operator.add and decision.then.args == (SELF, n["b2"])


def test_linears_reading_their_weights_through_casts_are_sharded_with_the_casts():
    """whisper's `F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))`: the weights are cast in
    forward, each cast read by its linear alone; the walker shards the parameters (column, then row) and
    the casts with them, and nothing is left whole."""
    g = G()
    x = g.input("x", (2, 4, 8), R)
    casts = {}
    for name, shape in (("w1", (16, 8)), ("b1", (16,)), ("w2", (8, 16)), ("b2", (8,))):
        casts[name] = g.call("to", g.param(name, shape), torch.float32, shape=shape)
    up = g.call(F.linear, x, casts["w1"], casts["b1"], shape=(2, 4, 16))
    act = g.call(F.gelu, up, shape=(2, 4, 16))
    g.call(F.linear, act, casts["w2"], casts["b2"], shape=(2, 4, 8))
    gm = g.module()
    walker = Walker(gm, 2)
    walker.run()
    assert walker.left_whole == []
    assert walker.param_shardings == {"w1": Shard(0), "b1": Shard(0), "w2": Shard(1)}
    assert [info(casts[k]).sharding for k in ("w1", "b1", "w2")] == [Shard(0), Shard(0), Shard(1)]
    assert info(casts["b2"]).sharding == R  # the row-parallel bias, added once after the sum


def test_a_cast_weight_read_twice_is_not_sharded_through():
    """A cast of a parameter read by two ops is a value of its own: its linear stays whole."""
    g = G()
    x = g.input("x", (2, 4, 8), R)
    w = g.call("to", g.param("w", (16, 8)), torch.float32, shape=(16, 8))
    up = g.call(F.linear, x, w, shape=(2, 4, 16))
    g.graph.output((up, g.call("sum", w, shape=())))
    gm = g.module()
    walker = Walker(gm, 2)
    walker.run()
    assert walker.param_shardings == {}


def test_linear_whose_shard_would_be_gathered_first_stays_whole():
    g = G()
    up, _, _ = _mlp(g, then_norm=True)
    decision = g.decide(up)
    assert decision.out == R and not decision.params
    assert "gathered before any row-parallel layer" in decision.reason


def test_embedding_becomes_vocab_parallel():
    g = G()
    ids, w = g.input("ids", (2, 4), R, grad=False, dtype=torch.int64), g.param("wte", (16, 8))
    decision = g.decide(g.call(F.embedding, ids, w, shape=(2, 4, 8)))
    assert decision.out == R and decision.params == ((w, Shard(0)),)
    # the real vocabulary of 16 rows: ids outside it fail, as in the untouched lookup
    assert decision.swap.target is tpops.vocab_parallel_embedding and decision.swap.args == (ids, w, None, COMM, 16)


def test_embedding_with_an_odd_vocabulary_shards_its_width():
    g = G()
    ids, w = g.input("ids", (2, 4), R, grad=False, dtype=torch.int64), g.param("wte", (15, 8))
    decision = g.decide(g.call(F.embedding, ids, w, shape=(2, 4, 8)))
    assert decision.out == S(2) and decision.params == ((w, Shard(1)),) and decision.swap is None


def test_cross_entropy_over_vocab_sharded_logits():
    g = G()
    logits, target = g.input("logits", (8, 16), S(1)), g.input("target", (8,), R, grad=False, dtype=torch.int64)
    decision = g.decide(g.call(F.cross_entropy, logits, target, shape=()))
    assert decision.swap.target is tpops.vocab_parallel_cross_entropy
    assert decision.swap.args == (logits, target, -100, "mean", COMM)


@pytest.mark.parametrize("dim, then", [(2, operator.mul), (1, None)])
def test_size_of_the_sharded_dim_answers_the_global_size(dim, then):
    g = G()
    x = g.input("x", (2, 4, 8), S(2))
    decision = g.decide(g.call("size", x, dim, value="scalar"))
    assert decision.out is None
    assert (decision.then.target if decision.then else None) is then


# --- a vocabulary tp does not divide: padded inside ----------------------------------------------

V = 97  # no tp > 1 divides it
PADDED = Shard(2, size=V)


def test_a_padded_shard_holds_ceil_rows_the_last_ones_zero():
    full = torch.arange(V * 2, dtype=torch.float32).view(V, 2)
    layout = Shard(0, size=V)
    blocks = [shard_tensor(full, layout, r, 4) for r in range(4)]
    assert [b.shape[0] for b in blocks] == [25] * 4 and local_shape((V, 2), layout, 4) == (25, 2)
    assert [real_rows(layout, r, 4, V) for r in range(4)] == [(0, 25), (25, 25), (50, 25), (75, 22)]
    assert torch.equal(torch.cat([unpad(b, layout, r, 4) for r, b in enumerate(blocks)]), full)
    assert not blocks[3][22:].any()  # padding: zeros
    assert torch.equal(shard_tensor(full, layout, 3, 4, pad=False), full[75:])
    assert str(layout) == "S(0, size=97)" and layout.to_dict()["size"] == V and S(0) == Shard(0, size=None)


def test_an_output_layer_tp_does_not_divide_is_column_parallel_padded():
    g = G()
    x, w, b = g.input("x", (2, 4, 8), R), g.param("w", (V, 8)), g.param("b", (V,))
    decision = g.decide(g.call(F.linear, x, w, b, shape=(2, 4, V)))
    assert decision.out == PADDED
    assert decision.params == ((w, Shard(0, size=V)), (b, Shard(0, size=V)))


@pytest.mark.parametrize("features, tp", [(1, 2), (5, 4)])
def test_an_output_layer_too_narrow_to_pad_stays_whole(features, tp):
    """Padding only where every rank holds real rows: a value head of 1 feature is not split."""
    g = G()
    x, w = g.input("x", (2, 4, 8), R), g.param("w", (features, 8))
    decision = g.decide(g.call(F.linear, x, w, shape=(2, 4, features)), tp=tp)
    assert decision.out == R and not decision.params and "not divisible" in decision.reason


def test_an_embedding_tied_to_the_output_layer_pads_its_vocabulary():
    g = G()
    ids, w = g.input("ids", (2, 4), R, grad=False, dtype=torch.int64), g.param("wte", (V, 8))
    emb = g.call(F.embedding, ids, w, shape=(2, 4, 8))
    g.graph.output(g.call(F.linear, emb, w, shape=(2, 4, V)))
    decision = g.decide(emb)
    assert decision.out == R and decision.params == ((w, Shard(0, size=V)),)
    assert decision.swap.target is tpops.vocab_parallel_embedding


def test_a_padded_shard_survives_views_that_keep_its_dim_with_the_size_rounded_up():
    g = G()
    logits = g.input("logits", (2, 4, V), PADDED)
    decision = g.decide(g.call("view", logits, -1, V, shape=(8, V)))
    assert decision.out == Shard(1, size=V) and decision.edit.args[1:] == (-1, Local(V, padded=True))
    assert g.decide(g.call("flatten", logits, 0, 1, shape=(8, V))).out == Shard(1, size=V)
    assert g.decide(g.call("transpose", logits, 1, 2, shape=(2, V, 4))).out == Shard(1, size=V)
    moved = g.decide(g.call("view", logits, 2, 4 * V, shape=(2, 4 * V)))  # merges the padded dim: whole
    assert moved.out == R and names(moved.inputs) == [("logits", R)]


@pytest.mark.parametrize("op, args", [(operator.mul, (2.0,)), (F.softmax, (-1,)), (torch.sum, (-1,))])
def test_ops_that_would_read_the_padding_get_the_value_whole(op, args):
    g = G()
    logits = g.input("logits", (2, 4, V), PADDED)
    decision = g.decide(g.call(op, logits, *args, shape=(2, 4, V)))
    assert decision.out == R and names(decision.inputs) == [("logits", R)]
    assert "tp does not divide" in decision.reason


def test_cross_entropy_over_padded_logits_is_told_the_vocabulary():
    g = G()
    logits, target = g.input("logits", (8, V), Shard(1, size=V)), g.input("target", (8,), R, grad=False, dtype=torch.int64)
    decision = g.decide(g.call(F.cross_entropy, logits, target, shape=()))
    assert decision.swap.target is tpops.vocab_parallel_cross_entropy and decision.swap.kwargs == {"vocab": V}


def test_size_of_a_padded_dim_answers_the_real_size():
    g = G()
    logits = g.input("logits", (2, 4, V), PADDED)
    decision = g.decide(g.call("size", logits, -1, value="scalar"))
    assert decision.then.target is tpops.unpadded and decision.then.args == (SELF, 49, V)
    assert tpops.unpadded(49, 49, V) == V and tpops.unpadded(2 * 4 * 49, 49, V) == 2 * 4 * V  # size(-1), numel()


def test_padded_logits_reaching_the_output_are_gathered_and_cut():
    g = G()
    x, w = g.input("x", (2, 4, 8), R), g.param("w", (V, 8))
    logits = g.call(F.linear, x, w, shape=(2, 4, V))
    n = g.call("size", logits, -1, value="scalar")
    g.graph.output(g.call("view", logits, -1, n, shape=(8, V)))
    gm = g.module()
    walker = Walker(gm, 2)
    walker.run()
    gm.graph.lint()
    (gather,) = [n for n in gm.graph.nodes if n.target is tpops.gather_from_tp]
    assert gather.args[1] == 1 and gather.kwargs == {"size": V}
    # the computed size (97) becomes the local block, rounded up: (97 + 1) // 2
    (add,) = [n for n in gm.graph.nodes if n.target is operator.add]
    assert add.args[1] == 1 and next(iter(add.users)).target is operator.floordiv
    assert walker.param_shardings == {"w": Shard(0, size=V)}


# --- the walker and the redistribute step --------------------------------------------------------

def _collectives(gm: fx.GraphModule) -> list[str]:
    return [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function" and n.target.__module__ == tpops.__name__]


def test_two_column_parallel_layers_share_one_f():
    """q and k read the same whole input: one copy_to_tp, so autograd sums their input
    gradients first and backward runs one all-reduce."""
    g = G()
    x = g.input("x", (2, 4, 8), None)
    wq, wk, wo = g.param("wq", (8, 8)), g.param("wk", (8, 8)), g.param("wo", (8, 8))
    q = g.call(F.linear, x, wq, shape=(2, 4, 8))
    k = g.call(F.linear, x, wk, shape=(2, 4, 8))
    s = g.call(operator.mul, q, k, shape=(2, 4, 8))
    g.graph.output(g.call(F.linear, s, wo, shape=(2, 4, 8)))
    gm = g.module()
    walker = Walker(gm, 2)
    walker.run()
    gm.graph.lint()
    assert _collectives(gm) == ["copy_to_tp", "reduce_from_tp"]
    assert walker.param_shardings == {"wq": S(0), "wk": S(0), "wo": S(1)}
    assert walker.left_whole == []


def test_one_gather_per_value_for_every_consumer_that_needs_it_whole():
    g = G()
    x = g.input("x", (2, 4, 8), S(2))
    a = g.call(torch.cumsum, x, 2, shape=(2, 4, 8))
    b = g.call(torch.cumsum, x, 1, shape=(2, 4, 8))
    g.graph.output((a, b))
    gm = g.module()
    walker = Walker(gm, 2)
    walker.run()
    gathers = [n for n in gm.graph.nodes if n.target is tpops.gather_from_tp]
    assert len(gathers) == 1 and gathers[0].args[:2] == (x, 2)
    assert [r.node for r in walker.left_whole] == ["cumsum", "cumsum_1"]
    assert info(a).sharding == R and info(gathers[0]).kind == OpKind.COLLECTIVE


def test_every_family_with_a_rule_is_one_the_walker_can_reach():
    ruled = set(RULES)
    assert OpKind.OTHER in ruled  # the fallback
    assert not ruled & {OpKind.COLLECTIVE, OpKind.CAST, OpKind.CHECKPOINT}


def test_a_fused_projection_viewed_as_chunks_heads_head_dim_shards_its_heads():
    from graphsplit.passes.tensor_parallel.layout import chunked_view_dim, split_heads

    # ModernBERT's qkv.view(B, T, 3, heads, head_dim): 3 chunks, the shard on the heads dim
    assert chunked_view_dim((4, 8, 96), (4, 8, 3, 4, 8), 2, 2) == (3, 3)
    assert chunked_view_dim((4, 8, 96), (4, 8, 3, 4, 8), 2, 8) is None  # 4 heads over tp 8: refused elsewhere
    assert chunked_view_dim((4, 8, 32), (4, 8, 2, 16), 2, 4) is None  # (kv heads, head_dim): never chunks
    assert chunked_view_dim((4, 8, 96), (4, 8, 4, 3, 8), 2, 2) is None  # heads first (GPT-NeoX): a plain shard
    assert split_heads((4, 8, 96), (4, 8, 3, 4, 8)) == 4 and split_heads((4, 8, 32), (4, 8, 4, 8)) == 4


@pytest.mark.parametrize("equation, ndims, letters", [
    ("blhe,bshe->bhls", [4, 4], (["blhe", "bshe"], "bhls")),
    ("b h i d, b j d -> b h i j", [4, 3], (["bhid", "bjd"], "bhij")),
    ("ij,jk", [2, 2], (["ij", "jk"], "ik")),  # implicit output: the letters met once, sorted
    ("ij,jk", [3, 2], None),
])
def test_einsum_equations_read_as_letters(equation, ndims, letters):
    from graphsplit.passes.tensor_parallel.layout import einsum_letters

    assert einsum_letters(equation, ndims) == letters


def test_an_ellipsis_is_letters_of_its_own_aligned_from_the_right():
    from graphsplit.passes.tensor_parallel.layout import einsum_letters

    (a, b), out = einsum_letters("...ij,...jk->...ik", [4, 3])
    assert a[2:] == "ij" and b[1:] == "jk" and a[1:2] == b[:1] and out == a[:2] + "ik"
