"""One table that classifies op spellings.

The tracers spell the same operation many ways: `call_module` on an
`nn.Linear`, `F.linear`, `aten.linear.default`, `aten.addmm`... Passes ask
`classify(node, gm)` for an `OpKind` and write each rule once.
"""

from __future__ import annotations

import enum
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

aten = torch.ops.aten


class OpKind(str, enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    PARAM = "param"
    LINEAR = "linear"
    EMBEDDING = "embedding"
    CONV = "conv"
    MATMUL = "matmul"
    ATTENTION = "attention"
    NORM = "norm"
    VIEW = "view"
    GETITEM = "getitem"
    SHAPE = "shape"
    ASSERT = "assert"
    OTHER = "other"


_MODULE_KINDS: tuple[tuple[type[nn.Module], OpKind], ...] = (
    (nn.Linear, OpKind.LINEAR),
    (nn.Embedding, OpKind.EMBEDDING),
    (nn.modules.conv._ConvNd, OpKind.CONV),
    (nn.LayerNorm, OpKind.NORM),
    (nn.modules.batchnorm._BatchNorm, OpKind.NORM),
    (nn.GroupNorm, OpKind.NORM),
    (nn.MultiheadAttention, OpKind.ATTENTION),
)
if hasattr(nn, "RMSNorm"):
    _MODULE_KINDS += ((nn.RMSNorm, OpKind.NORM),)


def _overloads(*packets: object) -> set[object]:
    """An aten packet and all its overloads, so `aten.view` matches `aten.view.default`."""
    found: set[object] = set()
    for p in packets:
        found.add(p)
        for name in getattr(p, "overloads", lambda: [])():
            found.add(getattr(p, name))
    return found


_FUNCTION_KINDS: dict[object, OpKind] = {}
for _targets, _kind in (
    ((F.linear, torch.addmm, *_overloads(aten.linear, aten.addmm)), OpKind.LINEAR),
    ((F.embedding, *_overloads(aten.embedding)), OpKind.EMBEDDING),
    ((F.conv1d, F.conv2d, F.conv3d, *_overloads(aten.conv1d, aten.conv2d, aten.conv3d, aten.convolution)), OpKind.CONV),
    ((torch.matmul, torch.bmm, torch.mm, operator.matmul, *_overloads(aten.matmul, aten.bmm, aten.mm)), OpKind.MATMUL),
    ((F.scaled_dot_product_attention, *_overloads(aten.scaled_dot_product_attention)), OpKind.ATTENTION),
    ((F.layer_norm, F.batch_norm, F.group_norm, *_overloads(aten.layer_norm, aten.batch_norm, aten.group_norm)), OpKind.NORM),
    ((torch.reshape, *_overloads(aten.view, aten.reshape, aten._unsafe_view)), OpKind.VIEW),
    ((operator.getitem,), OpKind.GETITEM),
    ((getattr, *_overloads(aten.sym_size)), OpKind.SHAPE),
    ((torch._assert, torch.fx._symbolic_trace._assert_is_none,
      *_overloads(aten._assert_scalar, aten._assert_tensor_metadata)), OpKind.ASSERT),
):
    for _t in _targets:
        _FUNCTION_KINDS[_t] = _kind

_METHOD_KINDS: dict[str, OpKind] = {
    "view": OpKind.VIEW,
    "reshape": OpKind.VIEW,
    "size": OpKind.SHAPE,
    "dim": OpKind.SHAPE,
    "matmul": OpKind.MATMUL,
    "bmm": OpKind.MATMUL,
}


def classify(node: fx.Node, gm: fx.GraphModule) -> OpKind:
    """The kind of operation `node` performs, whatever spelling the tracer used."""
    if node.op == "placeholder":
        return OpKind.INPUT
    if node.op == "output":
        return OpKind.OUTPUT
    if node.op == "get_attr":
        return OpKind.PARAM
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        for cls, kind in _MODULE_KINDS:
            if isinstance(mod, cls):
                return kind
        if type(mod).__name__ == "Conv1D":  # HF GPT-2's transposed linear
            return OpKind.LINEAR
        return OpKind.OTHER
    if node.op == "call_method":
        return _METHOD_KINDS.get(str(node.target), OpKind.OTHER)
    try:
        return _FUNCTION_KINDS.get(node.target, OpKind.OTHER)
    except TypeError:  # unhashable target
        return OpKind.OTHER


# Kinds whose node computes heavily enough to be worth a pipeline boundary near it.
COMPUTE_KINDS = frozenset({OpKind.LINEAR, OpKind.EMBEDDING, OpKind.CONV, OpKind.MATMUL, OpKind.ATTENTION})


# ---------------------------------------------------------------------------
# Families for sharding propagation (tensor_parallel pass). The same table
# serves every spelling: torch functions, Tensor methods, operator.*, nn
# activation modules and ATen overloads (pointwise ops are found by ATen's
# own `pointwise` tag, so the list is torch's, not ours).

_OPERATOR_NAMES = {
    operator.add: "add", operator.iadd: "add", operator.sub: "sub", operator.isub: "sub",
    operator.mul: "mul", operator.imul: "mul", operator.truediv: "div", operator.itruediv: "div",
    operator.neg: "neg", operator.pow: "pow", operator.eq: "eq", operator.ne: "ne",
    operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge",
    operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.invert: "bitwise_not",
}
_ACTIVATION_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.Identity, nn.LeakyReLU, nn.ELU,
    nn.Softplus, nn.Mish, nn.Hardswish, nn.ReLU6,
)
_IDENTITY = {"contiguous", "clone", "detach", "to", "float", "half", "bfloat16", "double", "type_as",
             "alias", "_to_copy", "dropout", "native_dropout", "feature_dropout", "requires_grad_", "type"}
_VIEW = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as"}
_TRANSPOSE = {"transpose", "t", "permute", "swapaxes", "swapdims"}
_SPLIT = {"split", "chunk", "split_with_sizes"}
_CAT = {"cat", "concat", "concatenate"}
_SOFTMAX = {"softmax", "log_softmax", "_softmax", "_log_softmax"}
_REDUCTION = {"sum", "mean", "amax", "amin", "var", "std", "logsumexp", "norm", "prod", "max", "min"}
_SIZE = {"size", "sym_size", "dim", "numel", "sym_numel"}


def _op_name(node: fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.__name__
    if target in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[target]
    return getattr(target, "__name__", str(target))


def _is_pointwise(name: str, node: fx.Node) -> bool:
    if isinstance(node.target, torch._ops.OpOverload):
        return torch.Tag.pointwise in node.target.tags
    packet = getattr(aten, name.rstrip("_"), None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return False
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


def tp_family(node: fx.Node, gm: fx.GraphModule) -> str:
    """The sharding rule family of `node` (see passes/tensor_parallel.py)."""
    kind = classify(node, gm)
    if kind in (OpKind.LINEAR, OpKind.EMBEDDING, OpKind.MATMUL, OpKind.ATTENTION, OpKind.NORM, OpKind.GETITEM):
        return kind.value
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        return "pointwise" if isinstance(mod, _ACTIVATION_MODULES) else "unknown"
    if node.op not in ("call_function", "call_method"):
        return kind.value
    if node.op == "call_function" and node.target is getattr and len(node.args) > 1 and node.args[1] == "shape":
        return "size"
    name = _op_name(node)
    bare = name.rstrip("_") if name not in ("_to_copy", "_unsafe_view", "_softmax", "_log_softmax") else name
    for family, names in (("identity", _IDENTITY), ("view", _VIEW), ("transpose", _TRANSPOSE), ("split", _SPLIT),
                          ("cat", _CAT), ("softmax", _SOFTMAX), ("reduction", _REDUCTION), ("size", _SIZE)):
        if bare in names:
            return family
    if bare in ("expand", "repeat_interleave", "stack", "cross_entropy"):
        return bare
    if bare in ("slice", "select") and isinstance(node.target, torch._ops.OpOverload):
        return "slice"
    if kind == OpKind.VIEW:
        return "view"
    if _is_pointwise(bare, node) or bare in ("dropout", "gelu", "silu", "relu"):
        return "pointwise"
    return "unknown"
