"""--fp8: the model's linears in float8, as torchao's float8 training converts them.

Every call of an `nn.Linear` module whose weight's two dims (as this tp rank holds it) are multiples of 16
(what `torch._scaled_mm` needs; torchtitan filters the same way) becomes `ops.float8.float8_linear`,
told how tensor parallelism cut it (column, row or whole) so its scales agree across the shards.
Sequence parallelism's column linears (which read the gathered tokens and keep their shard:
ops/tp.py's `column_linear_from_seq_shard`) are float8 too, keeping the shard and gathering it again in
backward. Other matmuls (`F.linear` on a weight of another module, attention's, HF's Conv1D as `addmm`)
keep their precision, as torchao's module swap leaves everything but `nn.Linear`; the modules made float8 are listed (`Program.fp8_modules`), so `--check`
converts the same ones in the untouched model. Runs after tensor
parallelism (whose shardings it reads) and before autocast (which casts the linear's input).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GraphsplitError
from ..ir.meta import META_KEY, info, insert_node
from ..ir.op_kinds import OpKind, register_function_kind
from ..ir.sharding import Shard
from ..ops.float8 import float8_linear, import_torchao
from ..ops.tp import column_linear_from_seq_shard
from ..ops.tp_comm import COMM_ATTR
from .functionalize import functionalize_modules
from .manager import PassInput, PassResults
from .tensor_parallel import TensorParallelResult
from .tensor_parallel.spellings import linear_form

register_function_kind(float8_linear, OpKind.LINEAR)

_ALIGN = 16  # torch._scaled_mm's K and N
# the spellings made float8: not sequence parallelism's gathering linear (it keeps the token shard for backward)
_LINEARS = (F.linear, torch.ops.aten.linear.default)


def fp8_eligible(out_features: int, in_features: int, style: str, tp: int) -> bool:
    """Whether a linear of this size and tp cut runs in float8: its dims as one rank holds them
    multiples of 16 (the planner asks the same)."""
    local_out = out_features // tp if style == "column" else out_features
    local_in = in_features // tp if style == "row" else in_features
    return local_out % _ALIGN == 0 and local_in % _ALIGN == 0


def float8_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, Float8Result | None]:
    """The linears made float8 (None without --fp8)."""
    recipe = inp.plan.fp8
    if recipe is None:
        return gm, None
    import_torchao()
    functionalize_modules(gm, (nn.Linear,))
    tp = inp.plan.tp
    shardings = done.get(TensorParallelResult).param_shardings if tp > 1 else {}
    comm: fx.Node | None = None
    converted: list[str] = []
    for node in list(gm.graph.nodes):
        gathering = node.op == "call_function" and node.target is column_linear_from_seq_shard
        form = linear_form(node) if node.op == "call_function" and node.target in _LINEARS else None
        if gathering:  # sequence parallelism's column linear of the gathered tokens, keeping their shard
            x, shard, weight, bias, dim, _ = node.args
        elif form is None or form[3] != 0:  # F.linear / aten.linear: weight [out, in]
            continue
        else:
            (x, weight, bias), shard, dim = form[:3], None, 0
        if not isinstance(weight, fx.Node) or weight.op != "get_attr":
            continue
        owner = str(weight.target).rpartition(".")[0]
        if not isinstance(_submodule(gm, owner), nn.Linear):  # torchao swaps nn.Linear modules, nothing else
            continue
        param = gm.get_parameter(str(weight.target))
        # the weight's layout as tensor parallelism left it (a tied LM head reads the embedding's
        # shards under its own name)
        sharding = info(weight).sharding if tp > 1 else None
        if not isinstance(sharding, Shard):
            sharding = shardings.get(str(weight.target))
        style = ("column" if sharding.dim == 0 else "row") if isinstance(sharding, Shard) else "replicated"
        if not fp8_eligible(param.shape[0], param.shape[1], style, tp):
            continue
        if style != "replicated" and comm is None:
            comm = _comm(gm)
        new = insert_node(gm.graph, float8_linear, (x, weight, bias, comm if style != "replicated" else None,
                                                    recipe, style, *((shard, dim) if gathering else ())),
                          owner=node, kind=OpKind.LINEAR, before=node)
        new.meta[META_KEY] = dataclasses.replace(info(node))  # the same value, cost and layout
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        converted.append(owner)
    gm.graph.lint()
    gm.recompile()
    return gm, Float8Result(tuple(dict.fromkeys(converted)))


@dataclass(frozen=True)
class Float8Result:
    modules: tuple[str, ...]  # the nn.Linear modules (by name) whose calls run in float8


def _submodule(gm: fx.GraphModule, name: str) -> nn.Module | None:
    try:
        return gm.get_submodule(name)
    except AttributeError:
        return None


def _comm(gm: fx.GraphModule) -> fx.Node:
    """The graph's tp communicator (tensor parallelism put it there with its collectives)."""
    found = next((n for n in gm.graph.nodes if n.op == "get_attr" and n.target == COMM_ATTR), None)
    if found is not None:
        return found
    if not hasattr(gm, COMM_ATTR):
        raise GraphsplitError("--fp8 under tp found a sharded linear but no tp communicator in the graph; "
                              "this is graphsplit's fault: run without --fp8 and report the model")
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        found = gm.graph.get_attr(COMM_ATTR)
    found.meta[META_KEY] = dataclasses.replace(info(first), value="scalar", tensor=None, flops=0, bytes_moved=0)
    return found
