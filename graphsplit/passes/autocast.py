"""autocast: run matmul-class ops in bf16 (or fp16), keep parameters, norms, softmax and the loss in fp32.

An explicit, graph-level autocast: every float input of a linear, matmul,
convolution or attention is cast to the low dtype (`x.to(torch.bfloat16)`,
visible in stage code); every input of a norm, softmax, reduction or
cross-entropy is cast to fp32; the model's outputs are cast to fp32 so the
loss is computed in fp32. Parameters stay fp32 (each use casts a copy), so the
optimizer state is fp32 too. Elementwise ops follow torch's type promotion
(bf16 + fp32 -> fp32: the residual stream stays fp32). After the rewrite the
graph is analyzed again and the dtypes are checked node by node.

fp16 works the same way; its training needs a loss scaler, which the
distributed backend keeps (one scale for all ranks, see
`DistributedPipeline._grad_scaler`).
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx
import torch.nn as nn

from ..analysis.shapes import annotate
from ..errors import GraphsplitError
from ..ir.grad_regions import AUTOCAST_OFF
from ..ir.meta import TensorSpec, info, insert_node
from ..ir.op_kinds import OpKind, Precision, family
from ..ops import tp as tpops
from .functionalize import functionalize_modules
from .manager import PassInput, PassResults
from .tensor_parallel import TensorParallelResult

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _Caster:
    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.cache: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}

    def cast(self, value: fx.Node, dtype: torch.dtype, at: fx.Node) -> fx.Node:
        spec = info(value).tensor
        # dtypes recorded before this pass are stale once casts go in upstream: cast every float
        # input (`.to` returns the tensor itself when it already has the dtype)
        if spec is None or not spec.dtype.is_floating_point or (value.op == "get_attr" and spec.dtype == dtype):
            return value
        found = self.cache.get((value, dtype))
        if found is None:
            found = self.cache[(value, dtype)] = insert_node(
                self.gm.graph, "to", (value, dtype), op="call_method", before=at, owner=at, kind=OpKind.CAST,
                tensor=TensorSpec(spec.shape, dtype, spec.requires_grad),
            )
        return found

    def cast_inputs(self, node: fx.Node, dtype: torch.dtype) -> None:
        for value in list(node.all_input_nodes):
            new = self.cast(value, dtype, node)
            if new is not value:
                node.replace_input_with(value, new)


def autocast_pass(gm: fx.GraphModule, inp: PassInput, done: PassResults) -> tuple[fx.GraphModule, None]:
    name = inp.plan.autocast
    if name is None:
        return gm, None
    low = LOW[name]
    functionalize_modules(gm, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))
    caster = _Caster(gm)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default \
                and not node.users:
            # export's check that a value has the dtype the trace saw (before a `.to`): this pass
            # changes dtypes by design (HF's router casts its bf16 logits to fp32 itself)
            gm.graph.erase_node(node)
            continue
        if node.op == "output":
            leaves = [caster.cast(leaf, torch.float32, node) if isinstance(leaf, fx.Node) else leaf
                      for leaf in node.args[0]]
            node.args = (tuple(leaves),)
            continue
        if node.op not in ("call_function", "call_method", "call_module") or info(node).value == "scalar" \
                or info(node).extra.get(AUTOCAST_OFF):  # the model runs it with autocast off: as written
            continue
        precision = family(node, gm).precision
        if precision == Precision.LOW:
            caster.cast_inputs(node, low)
        elif precision is not None or _beyond(node, low):
            caster.cast_inputs(node, torch.float32)
    if inp.plan.fsdp:
        _parameters_read_in_fp32(gm)
    _gather_cast_tokens(gm)
    gm.graph.lint()
    gm.recompile()
    tp = done.get(TensorParallelResult)
    annotate(gm, inp.example_inputs, param_shardings=dict(tp.param_shardings) if tp else {}, tp=inp.plan.tp)
    check_dtypes(gm, low)
    return gm, None


def _gather_cast_tokens(gm: fx.GraphModule) -> None:
    """Sequence parallelism's all-gather of tokens only cast linears read (`gather_for_column(x).to(bf16)`)
    gathers them cast (`gather_for_column(x.to(bf16))`, the cast the linears' kept shard already is):
    half the bytes each way, as Megatron gathers its bf16 activations. A cast commutes with the gather;
    backward, the input gradients' sum is reduce-scattered in the low dtype, as Megatron's is."""
    for gather in list(gm.graph.nodes):
        if gather.op != "call_function" or gather.target is not tpops.gather_for_column:
            continue
        casts = list(gather.users)
        if len(casts) != 1 or casts[0].op != "call_method" or casts[0].target != "to":
            continue
        cast, x = casts[0], gather.args[0]
        shard = next((u for u in x.users if u is not gather and u.op == "call_method" and u.target == "to"
                      and u.args[1:] == cast.args[1:]), None)
        if shard is None:
            shard = insert_node(gm.graph, "to", (x, *cast.args[1:]), op="call_method", after=x, owner=cast,
                                kind=OpKind.CAST, tensor=info(cast).tensor)
        elif list(gm.graph.nodes).index(shard) > list(gm.graph.nodes).index(gather):
            gather.prepend(shard)
        gather.args = (shard, *gather.args[1:])
        cast.replace_all_uses_with(gather)
        gm.graph.erase_node(cast)


def _beyond(node: fx.Node, low: torch.dtype) -> bool:
    """`node` takes a number the low dtype cannot hold (`masked_fill(scores, -torch.finfo(scores.dtype).max)`
    traced in fp32, x-transformers' mask): its tensors are read in fp32, where the number was meant."""
    limit = torch.finfo(low).max
    return any(isinstance(a, float) and math.isfinite(a) and abs(a) > limit for a in (*node.args, *node.kwargs.values()))


def _parameters_read_in_fp32(gm: fx.GraphModule) -> None:
    """Under FSDP the parameters arrive in the low dtype (apply_fsdp's MixedPrecisionPolicy gathers
    them so); every use outside a matmul-class op reads an fp32 copy, as without FSDP (an embedding's
    rows, a bias added to the residual stream, a scale), and a leaf module holding parameters has its
    output cast back to the dtype it has with fp32 ones: the program's dtypes, and what crosses a
    stage boundary, do not depend on how parameters are gathered."""
    functionalize_modules(gm, (nn.Embedding, nn.LayerNorm, *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())))
    params = {name for name, _ in gm.named_parameters()}
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and str(node.target) in params:
            spec = info(node).tensor
            if spec is None or not spec.dtype.is_floating_point:
                continue
            for user in list(node.users):
                if info(user).kind == OpKind.CAST or family(user, gm).precision == Precision.LOW:
                    continue
                up = insert_node(gm.graph, "to", (node, torch.float32), op="call_method", before=user, owner=user,
                                 kind=OpKind.CAST, tensor=TensorSpec(spec.shape, torch.float32, spec.requires_grad))
                user.replace_input_with(node, up)
        elif node.op == "call_module" and any(True for _ in gm.get_submodule(str(node.target)).parameters()):
            spec = info(node).tensor
            if spec is None or not spec.dtype.is_floating_point:
                continue
            users = list(node.users)
            back = insert_node(gm.graph, "to", (node, spec.dtype), op="call_method", after=node, owner=node,
                               kind=OpKind.CAST, tensor=spec)
            for user in users:
                user.replace_input_with(node, back)


def check_dtypes(gm: fx.GraphModule, low: torch.dtype) -> dict[str, int]:
    """Count matmul-class outputs in `low` and norm/softmax outputs in fp32; a norm or softmax
    computing in the low dtype is an error, not a trust."""
    counts = {"low": 0, "fp32": 0}
    for node in gm.graph.nodes:
        spec = info(node).tensor
        if spec is None or node.op not in ("call_function", "call_method", "call_module") \
                or info(node).extra.get(AUTOCAST_OFF):
            continue
        kind = family(node, gm)
        if kind.precision == Precision.LOW and spec.dtype == low:
            counts["low"] += 1
        elif kind.precision == Precision.FP32 and spec.dtype.is_floating_point:
            if spec.dtype != torch.float32:
                raise GraphsplitError(f"internal: {node.name} ({kind}) computes in {spec.dtype}, not float32")
            counts["fp32"] += 1
    return counts
