"""How a loss reduces over the batch, where that decides whether cutting the batch changes it.

A cross-entropy or NLL with reduction 'mean' divides by the number of tokens it counts (those
whose target is not `ignore_index`), and a masked mean `(loss * mask).sum() / mask.sum()` by the
mask's sum. Computed on each micro-batch and dp replica and averaged as equals, that is the whole
batch's mean only when every piece counts as many tokens: with uneven padding it is not (the
gradient-accumulation bug HF transformers fixed in 2024). Megatron and torchtitan divide each
piece's sum by the global count instead; `find_token_means` finds such means and, where it can
prove how they reduce, the count as a graph of the data alone (`CountGraph`), so the program can
normalize by the count over the whole global batch (passes/token_mean.py).

A mean is proven when:
- its count depends on the data only (inputs, target; no parameter, model output or random draw),
- its value reaches the graph's output through linear steps only (+, -, and * or / by a value that
  depends on no data), so each piece's share adds up to the whole batch's loss.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..ir.meta import info
from ..ir.op_kinds import OpKind, classify, op_name, randomness
from ..ir.reductions import from_sizes
from ..ir.walk import inputs, reachable

aten = torch.ops.aten
_MEAN = 1  # ATen's reduction enum: 0 none, 1 mean, 2 sum

_FUNCTIONS = {F.cross_entropy: "cross-entropy", F.nll_loss: "NLL"}
_ATEN = {aten.cross_entropy_loss: "cross-entropy", aten.nll_loss: "NLL", aten.nll_loss_nd: "NLL",
         aten.nll_loss2d: "NLL"}
_MODULES = {nn.CrossEntropyLoss: "cross-entropy", nn.NLLLoss: "NLL"}
# steps a loss may take to the output and stay a sum of its pieces' shares
_ADDITIVE = frozenset({"add", "sub", "neg", "sum", "mean", "stack", "cat"})
_KEEPS = (OpKind.IDENTITY, OpKind.VIEW)


@dataclass(frozen=True)
class CountGraph:
    """What a token mean divides by, as a graph of the data: `gm(*values)` is the count on a batch,
    `uses[i]` the position, among the placeholders of the graph the mean lies in, of the value fed
    as its i-th argument (the model's flat inputs; in the loss's graph, the target)."""

    gm: fx.GraphModule
    uses: tuple[int, ...]


@dataclass(frozen=True)
class TokenMean:
    """One mean over counted tokens: where, what, and its count (None, with `why_not`, when
    graphsplit cannot prove how it reduces)."""

    node: fx.Node  # the mean: the loss node, or a masked mean's division
    where: str  # the model's line, or the node's name
    what: str  # "cross-entropy", "NLL", "masked mean"
    count: CountGraph | None
    why_not: str = ""
    numerator: fx.Node | None = None  # a masked mean's sum
    offset: float = 0.0  # a constant the count is offset by (`/ (mask.sum() + 1e-4)`), added once
    summed: bool = False  # a loss with reduction 'sum': its count is none, offset one
    at_least: float = 0.0  # the count's floor (`/ count.maximum(ones_like(count))`, `clamp(min=1)`), once


@dataclass(frozen=True)
class Count:
    """One normalized mean: where it is (for `run`'s words) and its count graph, which reads the
    model's flat inputs (`reads` 'inputs') or the target ('target')."""

    where: str
    what: str
    reads: str
    graph: CountGraph
    offset: float = 0.0  # added once to the count over the global batch (a masked mean's `+ eps`)
    at_least: float = 0.0  # the count over the global batch, at least this (a masked mean's `.clamp(min=1)`)


@dataclass(frozen=True)
class TokenMeans:
    """The pass's result: the means normalized by the global count, in factor order; those it could not
    prove ('the cross-entropy at model.py:12: why'); the user's loss as a graph with its means rewritten
    (None when it has none to rewrite); whether loss_fn failed to trace."""

    counts: tuple[Count, ...]
    unproven: tuple[str, ...]
    loss_gm: fx.GraphModule | None
    loss_untraced: bool = False


def token_means(gm: fx.GraphModule) -> Iterator[str]:
    """Where `gm` averages a cross-entropy or NLL over the tokens it counts: the model's line (or
    the node's name)."""
    for node in gm.graph.nodes:
        if _loss_mean(node, gm) is not None:
            yield _where(node)


def find_token_means(gm: fx.GraphModule, data: Collection[fx.Node] | None = None,
                     sums: Collection[str] = ()) -> list[TokenMean]:
    """Every token mean of `gm` (annotated: targets' dtypes are read): cross-entropy and NLL with
    reduction 'mean' and class-index targets, masked means `sum(...) / sum(data)`, and sums over the
    samples (`sums`: the nodes that sum the batch away, analysis/batch/sums.py), each a mean whose count
    is one. `data`: the placeholders that hold data (default: all; in a loss's graph, the target, not
    the model's output)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    data = set(placeholders if data is None else data)
    batched = _depends_on(gm, set(placeholders))
    # a masked mean's numerator and count sum the samples too: the mean is what is normalized
    masked_means = [m for n in gm.graph.nodes if (m := _masked_mean(n, gm, data)) is not None]
    numerators = {t for m in masked_means for t in (*(_sum_terms(m[0], gm) or ()), _full_sum(m[1], gm))}
    found = []
    for node in gm.graph.nodes:
        # a sum the discovery found (or, where it did not run, a summed cross-entropy / NLL)
        if (node.name in sums and node not in numerators and _loss_mean(node, gm) is None) or \
                (_loss_sum(node, gm) is not None and node not in numerators):
            summed = _sum_over_samples(node, gm, data, placeholders, batched)
            if summed is not None:
                found.append(summed)
            continue
        mean = _loss_mean(node, gm)
        if mean is not None:
            what, target, ignore_index, why = mean
            spec = info(target).tensor if isinstance(target, fx.Node) else None
            if spec is not None and spec.dtype.is_floating_point:
                continue  # class probabilities: the mean is over examples, alike in every piece
            why = why or _not_data(target, gm, data) or _not_additive(node, gm, batched)
            count = None if why else _extract(gm, target, placeholders, _not_ignored(ignore_index))
            found.append(TokenMean(node, _where(node), what, count, why))
            continue
        masked = _masked_mean(node, gm, data)
        if masked is not None:
            numerator, denominator, offset, floor = masked
            why = _not_additive(node, gm, batched)
            count = None if why else _extract(gm, denominator, placeholders, None)
            found.append(TokenMean(node, _where(node), "masked mean", count, why, numerator, offset, at_least=floor))
    return found


def _sum_over_samples(node: fx.Node, gm: fx.GraphModule, data: set[fx.Node], placeholders: list[fx.Node],
                      batched: set[fx.Node]) -> TokenMean | None:
    """A sum over the samples as a mean with no count and an offset of one, so each piece's share is its
    own sum; None where the sum is divided by a size read from the data (`x.sum() / x.size(0)`: a mean of
    the piece it runs on, which the pieces average)."""
    if _normalized_by_size(node):
        return None
    summed = _loss_sum(node, gm)
    what, counted = summed if summed is not None else ("sum over the samples", None)
    if not isinstance(counted, fx.Node) or _not_data(counted, gm, data):  # any tensor of the data makes the
        # count's graph (it counts none)
        counted = next((p for p in placeholders if p in data and info(p).tensor is not None), None)
    why = _not_additive(node, gm, batched) if counted is not None else "no tensor of the data to count by"
    count = None if why else _extract(gm, counted, placeholders, _none_counted)
    return TokenMean(node, _where(node), what, count, why, offset=1.0, summed=True)


def _normalized_by_size(node: fx.Node) -> bool:
    """Whether, on its way to the output, `node` is divided (or multiplied) by a value made from sizes."""
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        for user in n.users:
            if user in seen or user.op == "output":
                continue
            if _divides_by_size(user, n):
                return True
            seen.add(user)
            stack.append(user)
    return False


def _divides_by_size(user: fx.Node, value: fx.Node) -> bool:
    """`value / n` or `value * (1 / n)`, n made from sizes (`x.size(0)`, `x.numel()`)."""
    name = op_name(user) if user.op in ("call_function", "call_method") else ""
    if name in ("div", "true_divide") and len(user.args) > 1 and user.args[0] is value:
        return from_sizes(user.args[1])
    if name == "mul":
        return any(isinstance(a, fx.Node) and a is not value and op_name(a) in ("div", "true_divide") and
                   len(a.args) > 1 and not isinstance(a.args[0], fx.Node) and from_sizes(a.args[1]) for a in user.args)
    return False


def additive_in(gm: fx.GraphModule, node: fx.Node) -> str:
    """'' when `node`'s value reaches `gm`'s output through linear steps only, else why not."""
    return _not_additive(node, gm, _depends_on(gm, {n for n in gm.graph.nodes if n.op == "placeholder"}))


def _where(node: fx.Node) -> str:
    source = info(node).source
    return str(source) if source is not None else node.name


def _arg(node: fx.Node, index: int, key: str, default: object) -> object:
    return node.args[index] if len(node.args) > index else node.kwargs.get(key, default)


def _loss_mean(node: fx.Node, gm: fx.GraphModule) -> tuple[str, object, int, str] | None:
    """(what, target, ignore_index, why not provable or '') for a cross-entropy / NLL with reduction
    'mean', in any spelling; None for anything else."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        what = next((w for cls, w in _MODULES.items() if isinstance(module, cls)), None)
        if what is None or module.reduction != "mean":
            return None
        why = "it weighs classes (weight=)" if module.weight is not None else ""
        return what, _arg(node, 1, "target", None), module.ignore_index, why
    if node.op != "call_function":
        return None
    if node.target in _FUNCTIONS:
        if _arg(node, 6, "reduction", "mean") != "mean":
            return None
        legacy = _arg(node, 3, "size_average", None) is not None or _arg(node, 5, "reduce", None) is not None
        why = ("it weighs classes (weight=)" if _arg(node, 2, "weight", None) is not None else
               "it uses size_average / reduce" if legacy else "")
        return _FUNCTIONS[node.target], _arg(node, 1, "target", None), _arg(node, 4, "ignore_index", -100), why
    if isinstance(node.target, torch._ops.OpOverload) and node.target.overloadpacket in _ATEN:
        if _arg(node, 3, "reduction", _MEAN) != _MEAN:
            return None
        why = "it weighs classes (weight=)" if _arg(node, 2, "weight", None) is not None else ""
        return _ATEN[node.target.overloadpacket], node.args[1], _arg(node, 4, "ignore_index", -100), why
    return None


def _loss_sum(node: fx.Node, gm: fx.GraphModule) -> tuple[str, object] | None:
    """(what, target) for a cross-entropy / NLL with reduction 'sum' (class indices or probabilities,
    weighted or not: a sum of per-token terms either way), in any spelling; None for anything else."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        what = next((w for cls, w in _MODULES.items() if isinstance(module, cls)), None)
        return (f"summed {what}", _arg(node, 1, "target", None)) if what and module.reduction == "sum" else None
    if node.op != "call_function":
        return None
    if node.target in _FUNCTIONS:
        legacy = _arg(node, 3, "size_average", None) is not None or _arg(node, 5, "reduce", None) is not None
        summed = _arg(node, 6, "reduction", "mean") == "sum" and not legacy
        return (f"summed {_FUNCTIONS[node.target]}", _arg(node, 1, "target", None)) if summed else None
    if isinstance(node.target, torch._ops.OpOverload) and node.target.overloadpacket in _ATEN:
        return (f"summed {_ATEN[node.target.overloadpacket]}", node.args[1]) if _arg(node, 3, "reduction", _MEAN) == 2 \
            else None
    return None


def _none_counted(graph: fx.Graph, target: fx.Node) -> fx.Node:
    """A sum's count: none per piece; the offset of one makes the factor the number of pieces."""
    return graph.call_method("sum", (graph.call_function(torch.mul, (target, 0)),))


def _full_sum(node: object, gm: fx.GraphModule) -> fx.Node | None:
    """The sum over every element `node` is (through casts and views), or None."""
    while isinstance(node, fx.Node) and classify(node, gm) in _KEEPS and node.args:
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method") or op_name(node) != "sum":
        return None
    dims = _arg(node, 1, "dim", None)
    return node if dims is None or isinstance(dims, torch.dtype) else None


def _sum_terms(node: object, gm: fx.GraphModule) -> list[fx.Node] | None:
    """The full sums (`x.sum()`, a cross-entropy with reduction 'sum') whose total `node` is, through casts
    and views: a chunked loss adds one per chunk (`total += F.cross_entropy(chunk, ..., reduction="sum")`,
    from `0.0`); None where it is anything else."""
    while isinstance(node, fx.Node) and classify(node, gm) in _KEEPS and node.args:
        node = node.args[0]
    if not isinstance(node, fx.Node):
        return None
    if _full_sum(node, gm) is not None or _loss_sum(node, gm) is not None:
        return [node]
    if node.op in ("call_function", "call_method") and op_name(node) in ("add", "iadd") and len(node.args) == 2:
        terms: list[fx.Node] = []
        for a in node.args:
            if isinstance(a, int | float) and not isinstance(a, bool) and a == 0:
                continue  # the running total's start
            found = _sum_terms(a, gm)
            if found is None:
                return None
            terms += found
        return terms or None
    return None


def _floor(denominator: object) -> tuple[object, float]:
    """`count.maximum(ones_like(count))`, `count.clamp(min=c)`, `count.clamp_min(c)` (litgpt's guard against
    an empty mask): (count, c); anything else: (itself, 0)."""
    if not isinstance(denominator, fx.Node) or denominator.op not in ("call_function", "call_method"):
        return denominator, 0.0
    name, args = op_name(denominator), denominator.args
    if name == "maximum" and len(args) == 2:
        for counted, other in (args, args[::-1]):
            if isinstance(other, fx.Node) and op_name(other) == "ones_like" and other.args[:1] == (counted,):
                return counted, 1.0
    if name in ("clamp", "clamp_min") and args:
        low = _arg(denominator, 1, "min", None)
        high = _arg(denominator, 2, "max", None) if name == "clamp" else None
        if isinstance(low, int | float) and not isinstance(low, bool) and high is None:
            return args[0], float(low)
    return denominator, 0.0


def _masked_mean(node: fx.Node, gm: fx.GraphModule,
                 data: set[fx.Node]) -> tuple[fx.Node, fx.Node, float, float] | None:
    """(numerator, denominator, offset, floor) of `sum(x) / sum(d)` where d is computed from the data alone
    and x is not: a mean weighted by a mask; `sum(x) / (sum(d) + c)` (an epsilon against an empty mask,
    loralib's GPT-2 loss) divides by the count plus a constant, which the whole batch adds once; `sum(x) /
    sum(d).clamp(min=c)` by the count or c where it is less (litgpt's chunked cross-entropy), once."""
    if node.op not in ("call_function", "call_method") or op_name(node) != "div" or len(node.args) < 2:
        return None
    numerator, (denominator, floor), offset = _sum_terms(node.args[0], gm), _floor(node.args[1]), 0.0
    if isinstance(denominator, fx.Node) and op_name(denominator) == "add" and len(denominator.args) == 2:
        terms = denominator.args
        constant = next((a for a in terms if isinstance(a, int | float) and not isinstance(a, bool)), None)
        counted = next((a for a in terms if isinstance(a, fx.Node)), None)
        if constant is not None and counted is not None and _full_sum(counted, gm) is not None:
            denominator, offset = counted, float(constant)
    if numerator is None or _full_sum(denominator, gm) is None or not isinstance(denominator, fx.Node):
        return None
    if _not_data(denominator, gm, data) or not _not_data(node.args[0], gm, data):
        return None
    return node.args[0], denominator, offset, floor  # type: ignore[return-value]


def _not_data(node: object, gm: fx.GraphModule, data: set[fx.Node]) -> str:
    """'' when `node` is computed from the data alone, else why not."""
    if not isinstance(node, fx.Node):
        return "its target is not a tensor of the data"
    for n in reachable([node], inputs):
        if n.op == "placeholder" and n not in data:
            return "its count depends on the model's output"
        if n.op in ("get_attr", "call_module"):
            return "its count reads a parameter or buffer of the model"
        if n.op != "placeholder" and randomness(n, gm) is not None:
            return "its count depends on a random draw"
    return ""


def _depends_on(gm: fx.GraphModule, roots: set[fx.Node]) -> set[fx.Node]:
    found = set(roots)
    for n in gm.graph.nodes:
        if any(a in found for a in n.all_input_nodes):
            found.add(n)
    return found


def _not_additive(node: fx.Node, gm: fx.GraphModule, batched: set[fx.Node]) -> str:
    """'' when every path from `node` to the output takes linear steps only, else why not."""
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        for user in n.users:
            if user.op == "output" or user in seen:
                continue
            name = op_name(user) if user.op in ("call_function", "call_method") else str(user.target)
            if user.op in ("call_function", "call_method") and (name in _ADDITIVE or classify(user, gm) in _KEEPS):
                pass
            elif name == "mul" or (name == "div" and user.args[0] is n):
                if any(a is not n and a in batched for a in user.all_input_nodes):
                    return f"its value is scaled by a value computed from the batch ({_where(user)})"
            else:
                return f"its value goes through {name} ({_where(user)}), not a sum of the pieces' shares"
            seen.add(user)
            stack.append(user)
    return ""


def _not_ignored(ignore_index: int) -> Callable[[fx.Graph, fx.Node], fx.Node]:
    def finish(graph: fx.Graph, target: fx.Node) -> fx.Node:
        return graph.call_method("sum", (graph.call_function(torch.ne, (target, ignore_index)),))

    return finish


def _extract(gm: fx.GraphModule, root: fx.Node, placeholders: list[fx.Node],
             finish: Callable[[fx.Graph, fx.Node], fx.Node] | None) -> CountGraph:
    """`root` and what it is computed from, as a graph of its own (`finish` adds the last steps)."""
    needed = set(reachable([root], inputs))
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    uses = []
    for n in gm.graph.nodes:
        if n not in needed:
            continue
        if n.op == "placeholder":
            env[n] = graph.placeholder(n.name)
            uses.append(placeholders.index(n))
        else:
            env[n] = graph.node_copy(n, env.__getitem__)
            env[n].meta = {}
    out = finish(graph, env[root]) if finish is not None else env[root]
    graph.output(out)
    return CountGraph(fx.GraphModule(torch.nn.Module(), graph, class_name="TokenCount"), tuple(uses))
