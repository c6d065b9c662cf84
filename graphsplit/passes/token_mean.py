"""Means over counted tokens normalized by the whole global batch's count, as Megatron and torchtitan do.

When the plan cuts the batch into pieces (micro-batches x dp replicas), each mean over counted
tokens that analysis/loss_reduction.py proves (a cross-entropy / NLL with reduction 'mean' and
ignore_index, a masked mean `sum(loss * mask) / mask.sum()`), in the model's graph or in
loss_fn, becomes its piece's sum times a factor fed each step:

    cross_entropy(logits, labels)              ->  token_scaled(cross_entropy(logits, labels, reduction='sum'),
                                                                self.token_scale, 0)

(ops/token_scale.py). The factor is pieces / N, N the tokens the mean counts over the whole
global batch, computed each step from the data by the mean's count graph (runtime/token_count.py),
so the schedule's 1/micro-batches and dp's gradient average leave exactly sum / N: loss and every
gradient are the untouched model's on the whole batch. A mean it cannot prove stays as it is
and `run` says how the pieces are combined (launch/loss_combination.py).

It runs before tensor parallelism, whose vocab-parallel cross-entropy then computes the sum
(vocab_parallel_loss.py takes the rewritten loss graph from here).
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
import torch.utils._pytree as pytree

from ..analysis.batch.sums import loss_batch_sums
from ..analysis.loss_reduction import Count, TokenMean, TokenMeans, additive_in, find_token_means
from ..analysis.shapes import annotate
from ..ir.meta import info, insert_node
from ..ir.op_kinds import OpKind
from ..ir.traced_model import split_leaves
from ..ops.token_scale import SCALE_ATTR, TokenScale, token_scaled
from .loss_graph import trace_loss
from .manager import PassInput, PassResults

aten = torch.ops.aten
_SUM = 2  # ATen's reduction enum: 0 none, 1 mean, 2 sum


def token_mean_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, TokenMeans | None]:
    plan = inp.plan
    if plan.num_microbatches * plan.dp == 1:  # one piece: its mean is the whole batch's
        return gm, None
    loss_gm, untraced, loss_sums = _trace_user_loss(gm, inp)
    model = find_token_means(gm, sums=inp.batch.sums if inp.batch is not None else ())
    loss: list[TokenMean] = []
    if loss_gm is not None and not (inp.loss is not None and inp.loss.whole_batch):
        target = [n for n in loss_gm.graph.nodes if n.op == "placeholder"][-1]
        loss = find_token_means(loss_gm, data={target}, sums=loss_sums)
    unproven = [f"the {m.what} {_at(m)}: {m.why_not}" for m in (*model, *loss) if m.count is None]
    proven_model = []
    for m in model:
        if m.count is None:
            continue
        why = _how_loss_fn_uses(gm, m.node, inp, loss_gm, untraced)
        if why:
            unproven.append(f"the {m.what} {_at(m)}: {why}")
        else:
            proven_model.append(m)
    proven_loss = [m for m in loss if m.count is not None]
    counts = [Count(_at(m), m.what, "inputs", m.count, m.offset, m.at_least) for m in proven_model]  # type: ignore[arg-type]
    counts += [Count("in loss_fn", m.what, "target", m.count, m.offset, m.at_least) for m in proven_loss]  # type: ignore[arg-type]
    _rewrite(gm, proven_model, 0, len(counts))
    _rewrite(loss_gm, proven_loss, len(proven_model), len(counts))
    if not counts and not unproven and not untraced:
        return gm, None
    return gm, TokenMeans(tuple(counts), tuple(unproven), loss_gm if proven_loss else None, untraced)


def _at(mean: TokenMean) -> str:
    return f"at {mean.where}"


def _trace_user_loss(gm: fx.GraphModule, inp: PassInput) -> tuple[fx.GraphModule | None, bool, tuple[str, ...]]:
    """loss_fn as a graph over the model's output leaves and the target, annotated at one micro-batch
    (None, True: it does not trace), and its nodes that sum the batch away."""
    loss = inp.loss
    if loss is None or loss.out_spec is None:
        return None, False, ()
    leaves, kinds = split_leaves(gm.graph.output_node().args[0])
    try:
        examples = [torch.empty(tuple(info(t).tensor.shape), dtype=info(t).tensor.dtype, device="meta")
                    for t in leaves]
        target = loss.target
        if target is None:  # loss_fn(output) with no example target: the stand-in `run` gives it
            from ..runtime.training import default_target

            target = default_target(inp.example_inputs)
        meta_target = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), target)
        loss_gm = trace_loss(loss.fn, loss.out_spec, kinds, len(leaves), (*examples, meta_target))
        annotate(loss_gm, (*examples, meta_target))
    except Exception:  # any tracer failure: the means in loss_fn cannot be seen
        return None, True, ()
    return loss_gm, False, _loss_sums(loss_gm, inp, kinds, examples, meta_target)


def _loss_sums(loss_gm: fx.GraphModule, inp: PassInput, kinds: list[tuple[str, object]], examples: list[torch.Tensor],
               target: object) -> tuple[str, ...]:
    """The loss graph's nodes that sum the batch away (analysis/batch/sums.py), its inputs' batch dims
    the program's: each output leaf's, each target leaf's."""
    batch = inp.batch
    if batch is None or not batch.batched:
        return ()
    dims: list[list[int | None]] = [[None] for _ in examples]
    for k, (kind, i) in enumerate(kinds):
        if kind == "tensor" and k < len(batch.outputs):
            dims[i] = [batch.outputs[k]]  # type: ignore[index]
    try:
        return loss_batch_sums(loss_gm, [*examples, target], [*dims, batch.target_dims(target)])
    except Exception:  # noqa: BLE001 - a loss the discovery cannot run: its sums are the summed losses' alone
        return ()


def _how_loss_fn_uses(gm: fx.GraphModule, node: fx.Node, inp: PassInput, loss_gm: fx.GraphModule | None,
                      untraced: bool) -> str:
    """'' when the objective takes the model's mean as a sum of the pieces' shares (no loss_fn: the
    model's own loss; a loss_fn adding it, or not reading it), else why not."""
    if inp.loss is None:
        return ""
    leaves, _ = split_leaves(gm.graph.output_node().args[0])
    reached = {node}
    for n in gm.graph.nodes:
        if any(a in reached for a in n.all_input_nodes):
            reached.add(n)
    read = [i for i, leaf in enumerate(leaves) if leaf in reached]
    if not read:
        return ""
    if loss_gm is None:
        return "loss_fn does not trace, so how it uses this loss is unknown" if untraced else ""
    outs = [n for n in loss_gm.graph.nodes if n.op == "placeholder"]
    for i in read:
        why = additive_in(loss_gm, outs[i])
        if why:
            return f"loss_fn uses it so: {why}"
    return ""


def _rewrite(gm: fx.GraphModule | None, means: list[TokenMean], first: int, total: int) -> None:
    """Each mean of `gm` -> its piece's sum times factor `first + i` of the step's `total`."""
    if gm is None or not means:
        return
    gm.add_submodule(SCALE_ATTR, TokenScale(total))
    graph = gm.graph
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        scale = graph.get_attr(SCALE_ATTR)
    info(scale).value = "scalar"
    for i, mean in enumerate(means):
        # a masked mean's division goes; a loss now sums, and its users read the scaled sum
        value = mean.numerator if mean.numerator is not None else mean.node if mean.summed else _as_sum(gm, mean.node)
        old = mean.node if mean.numerator is not None else value
        scaled = insert_node(graph, token_scaled, (value, scale, first + i), owner=old, kind=OpKind.OTHER,
                             after=old, tensor=info(old).tensor, source=info(old).source)
        old.replace_all_uses_with(scaled, delete_user_cb=lambda user, new=scaled: user is not new)
        if mean.numerator is not None:
            graph.erase_node(old)
    gm.recompile()


def _as_sum(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The cross-entropy / NLL `node` with reduction 'sum' (a module's call becomes the function's: the
    user's module is never edited)."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        is_ce = isinstance(module, torch.nn.CrossEntropyLoss)
        kwargs = {"ignore_index": module.ignore_index, "reduction": "sum"}
        if is_ce:
            kwargs["label_smoothing"] = module.label_smoothing
        target = node.args[1] if len(node.args) > 1 else node.kwargs["target"]
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(F.cross_entropy if is_ce else F.nll_loss, (node.args[0], target), kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        return new
    if node.target in (F.cross_entropy, F.nll_loss):
        if len(node.args) > 6:
            node.args = (*node.args[:6], "sum", *node.args[7:])
        else:
            node.kwargs = {**node.kwargs, "reduction": "sum"}
        return node
    if len(node.args) > 3:  # ATen: (self, target, weight, reduction, ignore_index, ...)
        node.args = (*node.args[:3], _SUM, *node.args[4:])
    else:
        node.kwargs = {**node.kwargs, "reduction": _SUM}
    return node
