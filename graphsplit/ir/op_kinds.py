"""One table that classifies op spellings, and one vocabulary of op kinds.

The tracers spell the same operation many ways: `call_module` on an
`nn.Linear`, `F.linear`, `aten.linear.default`, `aten.addmm`... Passes ask
`classify(node, gm)` (what the cost model and the report need) or
`family(node, gm)` (how a shard flows through it, where autocast puts it) for an
`OpKind`, read its properties (`kind.compute`, `kind.never_shards`,
`kind.precision`, ...) and write each rule once.
"""

from __future__ import annotations

import enum
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from .autograd_functions import FunctionCall

aten = torch.ops.aten


class Precision(enum.Enum):
    """Where autocast puts an op: the dtype its inputs are cast to."""

    LOW = "low"  # matmul-class: bf16 / fp16
    FP32 = "fp32"  # numerically sensitive: fp32, and its output is checked to be fp32
    UPCAST = "upcast"  # reductions and the loss: inputs cast to fp32


class Trait(enum.Flag):
    NONE = 0
    COMPUTE = enum.auto()  # heavy enough to be worth a pipeline boundary near it
    PASSES_SHARD = enum.auto()  # a sharded input flows through it with no collective
    NEVER_SHARDS = enum.auto()  # every tensor input whole -> output whole
    LAYOUT_ONLY = enum.auto()  # moves or relabels data, computes nothing (views, transposes)


_C, _PS, _NS, _LO = Trait.COMPUTE, Trait.PASSES_SHARD, Trait.NEVER_SHARDS, Trait.LAYOUT_ONLY


class OpKind(enum.Enum):
    """The one vocabulary of operations, each member with its properties.

    `classify` answers what a node is for the cost model and the report (the
    analysis records it as `NodeInfo.kind`); `family` refines `OTHER`, `VIEW` and
    `SHAPE` into how a tensor-parallel shard flows through the op (pointwise,
    transpose, split, ...). Passes invent the last kinds for the nodes they insert.
    """

    # member          = (label,               traits,              autocast)
    INPUT             = ("input",             Trait.NONE,          None)
    OUTPUT            = ("output",            Trait.NONE,          None)
    PARAM             = ("param",             Trait.NONE,          None)
    LINEAR            = ("linear",            _C,                  Precision.LOW)
    EMBEDDING         = ("embedding",         _C,                  None)
    CONV              = ("conv",              _C,                  Precision.LOW)
    MATMUL            = ("matmul",            _C | _PS,            Precision.LOW)
    # a batch of products added to a tensor: `beta * input + alpha * (a @ b)` (baddbmm: Megatron's and
    # BLOOM's attention scores, ALiBi's bias as `input`; addbmm, summed over the batch); every input in
    # the low dtype, as torch's autocast casts them (on CPU and CUDA alike: matrix-vector products,
    # which only CUDA's casts, stay as written)
    ADD_MATMUL        = ("add_matmul",        _C | _PS,            Precision.LOW)
    # one weight per expert ([E, in, out]), each token's rows through its expert's
    # (HF's grouped experts: `transformers::grouped_mm_fallback`, torch's grouped_mm)
    GROUPED_LINEAR    = ("grouped_linear",    _C,                  Precision.LOW)
    ATTENTION         = ("attention",         _C | _PS,            Precision.LOW)
    NORM              = ("norm",              _NS,                 Precision.FP32)
    VIEW              = ("view",              _PS | _NS | _LO,     None)
    GETITEM           = ("getitem",           _PS | _LO,           None)
    # a size query (as a family: x.size(), x.shape, numel, which answer global sizes)
    SHAPE             = ("shape",             _PS,                 None)
    ASSERT            = ("assert",            Trait.NONE,          None)
    # nothing known: a shard is gathered before it
    OTHER             = ("other",             Trait.NONE,          None)
    # families: how a shard flows through the ops classify calls OTHER (IDENTITY: clone,
    # detach, to, dropout, whose output has the layout of their first input)
    IDENTITY          = ("identity",          _PS | _LO,           None)
    POINTWISE         = ("pointwise",         _PS | _NS,           None)
    TRANSPOSE         = ("transpose",         _PS | _NS | _LO,     None)
    SPLIT             = ("split",             _PS | _NS,           None)
    CAT               = ("cat",               _PS | _NS,           None)
    STACK             = ("stack",             _PS | _NS,           None)
    EXPAND            = ("expand",            _PS | _NS,           None)
    REPEAT_INTERLEAVE = ("repeat_interleave", _PS | _NS,           None)
    SLICE             = ("slice",             _PS | _NS,           None)
    SOFTMAX           = ("softmax",           _PS | _NS,           Precision.FP32)
    REDUCTION         = ("reduction",         _NS,                 Precision.UPCAST)
    CROSS_ENTROPY     = ("cross_entropy",     Trait.NONE,          Precision.UPCAST)
    # torch.einsum: how a shard flows follows its equation's letters (rules/einsum.py); in the low dtype, as
    # torch.autocast runs the bmm it becomes
    EINSUM            = ("einsum",            Trait.NONE,          Precision.LOW)
    # a user's torch.autograd.Function kept whole (ir/autograd_functions.py: its own backward runs)
    FUNCTION          = ("function",          Trait.NONE,          None)
    # kinds of the nodes passes insert
    COLLECTIVE        = ("collective",        Trait.NONE,          None)
    CAST              = ("cast",              Trait.NONE,          None)
    CHECKPOINT        = ("checkpoint",        Trait.NONE,          None)

    def __init__(self, label: str, traits: Trait, precision: Precision | None) -> None:
        self.label = label
        self.traits = traits
        self.precision = precision

    @property
    def compute(self) -> bool:
        return Trait.COMPUTE in self.traits

    @property
    def passes_shard(self) -> bool:
        return Trait.PASSES_SHARD in self.traits

    @property
    def never_shards(self) -> bool:
        return Trait.NEVER_SHARDS in self.traits

    @property
    def layout_only(self) -> bool:
        return Trait.LAYOUT_ONLY in self.traits

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return f"OpKind.{self.name}"


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
    ((torch.baddbmm, torch.addbmm, *_overloads(aten.baddbmm, aten.addbmm)), OpKind.ADD_MATMUL),
    ((F.scaled_dot_product_attention, *_overloads(aten.scaled_dot_product_attention)), OpKind.ATTENTION),
    ((F.layer_norm, F.rms_norm, F.batch_norm, F.group_norm,
      *_overloads(aten.layer_norm, aten.rms_norm, aten.batch_norm, aten.group_norm)), OpKind.NORM),
    ((torch.reshape, *_overloads(aten.view, aten.reshape, aten._unsafe_view)), OpKind.VIEW),
    ((operator.getitem,), OpKind.GETITEM),
    ((getattr, *_overloads(aten.sym_size)), OpKind.SHAPE),
    ((torch._assert, torch.fx._symbolic_trace._assert_is_none,
      *_overloads(aten._assert_scalar, aten._assert_tensor_metadata)), OpKind.ASSERT),
):
    for _t in _targets:
        _FUNCTION_KINDS[_t] = _kind



def register_function_kind(target: object, kind: OpKind) -> None:
    """Classify calls of `target` as `kind`: for ops defined outside ir/ that passes insert
    (sequence parallelism's gathering linear is a LINEAR to autocast, the cost model, the report)."""
    _FUNCTION_KINDS[target] = kind


# by name: transformers registers its op only when imported, and torch spells grouped_mm
# three ways across versions
_GROUPED_MM_NAMES = frozenset({"grouped_mm_fallback", "grouped_mm", "_grouped_mm"})

_METHOD_KINDS: dict[str, OpKind] = {
    "view": OpKind.VIEW,
    "reshape": OpKind.VIEW,
    "size": OpKind.SHAPE,
    "dim": OpKind.SHAPE,
    "matmul": OpKind.MATMUL,
    "bmm": OpKind.MATMUL,
    "mm": OpKind.MATMUL,
    "baddbmm": OpKind.ADD_MATMUL,
    "addbmm": OpKind.ADD_MATMUL,
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
    if node.op == "call_function" and op_name(node) in _GROUPED_MM_NAMES:
        return OpKind.GROUPED_LINEAR
    try:
        return _FUNCTION_KINDS.get(node.target, OpKind.OTHER)
    except TypeError:  # unhashable target
        return OpKind.OTHER



# ---------------------------------------------------------------------------
# Families for sharding propagation and autocast. The same table serves every
# spelling: torch functions, Tensor methods, operator.*, nn activation modules
# and ATen overloads (pointwise ops are found by ATen's own `pointwise` tag, so
# the list is torch's, not ours).

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
# The op names of the families several modules read (aliasing, the batch rules, tp's lookahead), written
# once: every spelling of an op that reshapes without moving data (the aten forms export leaves too),
# that swaps dims by their numbers, that cuts a dim into pieces.
RESHAPES = ("view", "reshape", "_unsafe_view", "_reshape_alias", "_reshape_copy", "view_copy", "flatten", "unflatten",
            "squeeze", "unsqueeze", "view_as", "reshape_as")
TRANSPOSES = ("transpose", "t", "permute", "swapaxes", "swapdims")
SPLITS = ("split", "chunk", "split_with_sizes", "unbind")
# transposes of the last two dims spelled as attributes (no dim arguments to read)
MATRIX_TRANSPOSES = ("mT", "numpy_T")

_NAMED: dict[str, OpKind] = {}
for _kind, _names in (
    (OpKind.IDENTITY, ("contiguous", "clone", "detach", "to", "float", "half", "bfloat16", "double", "type_as",
                       "alias", "_to_copy", "dropout", "native_dropout", "feature_dropout", "requires_grad_", "type")),
    (OpKind.VIEW, RESHAPES),
    (OpKind.TRANSPOSE, TRANSPOSES),
    (OpKind.SPLIT, SPLITS),
    (OpKind.CAT, ("cat", "concat", "concatenate")),
    (OpKind.SOFTMAX, ("softmax", "log_softmax", "_softmax", "_log_softmax")),
    (OpKind.REDUCTION, ("sum", "mean", "amax", "amin", "var", "std", "logsumexp", "norm", "prod", "max", "min")),
    (OpKind.SHAPE, ("size", "sym_size", "dim", "numel", "sym_numel")),
    (OpKind.EXPAND, ("expand",)),
    (OpKind.REPEAT_INTERLEAVE, ("repeat_interleave",)),
    (OpKind.STACK, ("stack",)),
    (OpKind.CROSS_ENTROPY, ("cross_entropy", "cross_entropy_loss")),
    (OpKind.EINSUM, ("einsum",)),
):
    for _n in _names:
        _NAMED.setdefault(_n, _kind)
# names whose leading underscore is part of the name, not an in-place suffix to strip
_UNDERSCORED = ("_to_copy", "_unsafe_view", "_reshape_alias", "_reshape_copy", "_softmax", "_log_softmax")


def op_name(node: fx.Node) -> str:
    """The op's name whatever its spelling: `view` for `x.view`, `aten.view.default`; `add` for `operator.add`."""
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


def calls(node: object, *names: str) -> bool:
    """Whether `node` calls one of the ops `names`, in any spelling (`op_name`: `x.softmax`,
    `F.softmax`, `aten.softmax.int` are all `softmax`)."""
    return isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and op_name(node) in names


def _is_pointwise(name: str, node: fx.Node) -> bool:
    if isinstance(node.target, torch._ops.OpOverload):
        return torch.Tag.pointwise in node.target.tags
    packet = getattr(aten, name.rstrip("_"), None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return False
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


def family(node: fx.Node, gm: fx.GraphModule) -> OpKind:
    """How a tensor-parallel shard flows through `node` (and where autocast puts it):
    `classify`, with `OTHER`, `VIEW` and `SHAPE` refined by the op's name."""
    kind = classify(node, gm)
    if kind in (OpKind.LINEAR, OpKind.GROUPED_LINEAR, OpKind.EMBEDDING, OpKind.CONV, OpKind.MATMUL, OpKind.ADD_MATMUL,
                OpKind.ATTENTION, OpKind.NORM, OpKind.GETITEM):
        return kind
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        return OpKind.POINTWISE if isinstance(mod, _ACTIVATION_MODULES) else OpKind.OTHER
    if node.op not in ("call_function", "call_method"):
        return kind
    if node.op == "call_function" and node.target is getattr and len(node.args) > 1 and node.args[1] == "shape":
        return OpKind.SHAPE
    if node.op == "call_function" and isinstance(node.target, FunctionCall):
        return OpKind.FUNCTION
    name = op_name(node)
    bare = name.rstrip("_") if name not in _UNDERSCORED else name
    if bare in _NAMED:
        return _NAMED[bare]
    if bare in ("slice", "select") and isinstance(node.target, torch._ops.OpOverload):
        return OpKind.SLICE
    if kind == OpKind.VIEW:
        return OpKind.VIEW
    if _is_pointwise(bare, node) or bare in ("dropout", "gelu", "silu", "relu"):
        return OpKind.POINTWISE
    return OpKind.OTHER


# ---------------------------------------------------------------------------
# Sizes that follow the data: ops whose output's shape depends on the values of their input (a
# nonzero's rows, a mask's selection), and ops that write values of any size into a tensor of its own
# (its shape stays). A hand-written mixture of experts picks each expert's tokens so:
# `batch_idx, _ = torch.where(selected == i); results[batch_idx] += expert(inputs[batch_idx])`.

_DATA_SIZED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "_unique2",
                         "unique_dim", "nonzero_numpy"})
_WRITES_INTO = frozenset({"index_put", "index_add", "index_copy", "index_fill", "scatter", "scatter_add",
                          "scatter_reduce", "masked_scatter", "setitem", "_index_put_impl"})


def sizes_from_data(node: fx.Node, bool_index: bool = False) -> bool:
    """`node`'s output shape follows its input's values: a nonzero, a one-argument `torch.where`, a
    boolean mask's selection (`bool_index`: an index tensor of `x[...]` holds booleans)."""
    if node.op not in ("call_function", "call_method"):
        return False
    name = op_name(node)
    if name in _DATA_SIZED or (name == "where" and len(node.args) == 1 and not node.kwargs):
        return True
    return name in ("getitem", "index", "_unsafe_index") and bool_index


def writes_into(node: fx.Node) -> bool:
    """`node` writes values into its first argument's tensor, whose shape its output keeps."""
    if node.op not in ("call_function", "call_method"):
        return False
    name = op_name(node)
    return (name.rstrip("_") if name not in _UNDERSCORED else name) in _WRITES_INTO or name == "setitem"


# ---------------------------------------------------------------------------
# Random ops: what draws from a random generator. A dropout can be switched off (probability 0)
# without changing what the rest computes; any other draw (torch.rand in a module, a bernoulli
# mask) is part of what the model computes, and two runs agree on it only if they draw alike.

class Randomness(enum.Enum):
    DROPOUT = "dropout"  # a dropout in training mode with p > 0: the identity at p = 0
    DRAW = "draw"  # any other random draw


_DROPOUT_NAMES = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_dropout",
                            "feature_alpha_dropout", "native_dropout"})
_DRAW_NAMES = frozenset({"rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
                         "multinomial", "normal", "poisson", "uniform", "random", "exponential", "geometric", "cauchy",
                         "log_normal", "rrelu", "rrelu_with_noise"})


def draws(name: str) -> bool:
    """An op of this name draws random numbers (a dropout or any other draw), in any spelling
    (`bernoulli_`, `aten.rand`)."""
    bare = name.rstrip("_") if name not in _UNDERSCORED else name
    return bare in _DRAW_NAMES or bare in _DROPOUT_NAMES


def _dropout_active(node: fx.Node) -> bool:
    """A functional dropout draws unless its p is 0 or training is False (F.dropout's default
    is training=True; what the tracer saw is a constant)."""
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.kwargs.get("train", node.args[2] if len(node.args) > 2 else True))
    return not (isinstance(p, (int, float)) and p == 0) and training is not False


def _module_randomness(mod: nn.Module) -> Randomness | None:
    if not mod.training:
        return None
    if isinstance(mod, nn.modules.dropout._DropoutNd):
        return Randomness.DROPOUT if mod.p > 0 else None
    if isinstance(mod, nn.MultiheadAttention):  # dropout on the attention weights
        return Randomness.DROPOUT if mod.dropout > 0 else None
    return Randomness.DRAW if isinstance(mod, nn.RReLU) else None


def randomness(node: fx.Node, gm: fx.GraphModule) -> Randomness | None:
    """Whether `node` draws random numbers, and how (None: it does not), whatever its spelling:
    nn.Dropout and its kin as modules, F.dropout / torch.dropout / aten.native_dropout, attention's
    dropout (nn.MultiheadAttention, scaled_dot_product_attention's dropout_p), and the draws (torch.rand, x.bernoulli_(), aten.randperm, ...)."""
    if node.op == "call_module":  # a leaf (nn.TransformerEncoderLayer) draws what its parts draw
        found = {_module_randomness(m) for m in gm.get_submodule(str(node.target)).modules()} - {None}
        return Randomness.DRAW if Randomness.DRAW in found else found.pop() if found else None
    if node.op not in ("call_function", "call_method"):
        return None
    if classify(node, gm) == OpKind.ATTENTION:  # sdpa's dropout_p applies whatever the mode
        p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
        return None if isinstance(p, (int, float)) and p == 0 else Randomness.DROPOUT
    name = op_name(node)
    bare = name.rstrip("_") if name not in _UNDERSCORED else name
    if bare in _DROPOUT_NAMES:
        return Randomness.DROPOUT if _dropout_active(node) else None
    if bare in _DRAW_NAMES:
        return Randomness.DRAW
    return None
