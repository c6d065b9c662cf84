"""The per-node annotation: every decision graphsplit makes about a node.

All of it lives in `node.meta[META_KEY]` as one `NodeInfo`; passes read and
write it through `info(node)`. Nothing is stored as an attribute on `fx.Node`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .op_kinds import OpKind

META_KEY = "graphsplit"
# the node.meta keys that say which module a node belongs to (re-analysis reads the module
# stack; stage code prints export's stack trace above each line)
STAMP_KEYS = ("nn_module_stack", "stack_trace")


@dataclass
class TensorSpec:
    """Shape and dtype of one tensor value (sizes are ints or sympy-printable symbols)."""

    shape: tuple[Any, ...]
    dtype: torch.dtype
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        return math.prod(map(int, self.shape))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        return f"{dt}[{', '.join(str(s) for s in self.shape)}]"


@dataclass(frozen=True)
class SourceLine:
    """Where in the user's model code a node was made: the innermost frame outside torch."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}"


@dataclass
class NodeInfo:
    """What graphsplit knows and decided about one node.

    value: "tensor" (a single tensor), "container" (a tuple/list holding
    tensors: it can never cross a stage boundary) or "scalar" (ints, sizes,
    dtypes, None...: recomputed wherever it is needed, never sent).
    """

    kind: OpKind = OpKind.OTHER
    value: str = "scalar"
    tensor: TensorSpec | None = None
    flops: int = 0
    bytes_moved: int = 0
    param_bytes: int = 0
    module: str = ""
    stage: int | None = None
    # tensor parallel: how the output is laid out over the tp ranks (a Layout, a list of them
    # for a container; None: not decided, i.e. replicated)
    sharding: Any = None
    # the user's line that made it (None for nodes graphsplit inserted)
    source: SourceLine | None = None
    # False: the model ran this op under no_grad / inference_mode (or set_grad_enabled(False)).
    # The program runs every op with grad enabled; passes/grad_mode.py detaches such an op's
    # inputs so it records no autograd history, exactly as in the untouched model.
    grad_enabled: bool = True
    # its shape follows the data (a nonzero's rows, a boolean mask's selection, and what is computed from
    # them): measured on meta as if every element counted, and never sent between stages
    sizes_follow_data: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def out_bytes(self) -> int:
        return self.tensor.nbytes if self.tensor is not None else 0


def info(node: fx.Node) -> NodeInfo:
    """The node's annotation, created empty on first access."""
    found = node.meta.get(META_KEY)
    if found is None:
        found = node.meta[META_KEY] = NodeInfo()
    return found


def insert_node(
    graph: fx.Graph,
    target: Callable[..., Any] | str,
    args: tuple[Any, ...],
    *,
    owner: fx.Node,
    kind: OpKind,
    before: fx.Node | None = None,
    after: fx.Node | None = None,
    op: str = "call_function",
    value: str = "tensor",
    tensor: TensorSpec | None = None,
    kwargs: dict[str, Any] | None = None,
    **annotations: Any,
) -> fx.Node:
    """A new node just before `before` (or after `after`), annotated, that belongs to
    `owner`'s module: the module stack and stack trace are `owner`'s, so re-analysis and
    the per-block collective count attribute it there. `annotations` are further
    `NodeInfo` fields (`sharding`, `source`, `grad_enabled`)."""
    where = graph.inserting_before(before) if before is not None else graph.inserting_after(after)
    with where:
        new = graph.create_node(op, target, args, kwargs or {})
    new.meta.update({k: v for k, v in owner.meta.items() if k in STAMP_KEYS})
    new.meta[META_KEY] = NodeInfo(kind=kind, value=value, tensor=tensor, module=info(owner).module, **annotations)
    return new


def replace_node(
    node: fx.Node, target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> fx.Node:
    """A call of `target` in `node`'s place: the same meta (annotation included), every use moved."""
    with node.graph.inserting_before(node):
        new = node.graph.call_function(target, args, kwargs)
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    node.graph.erase_node(node)
    return new


def module_path(node: fx.Node) -> str:
    """Innermost user-module path the node came from ('' for the root)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v and isinstance(v[0], str)]
    paths = [p for p in paths if not p.startswith("_")]
    return paths[-1] if paths else ""


def canonical_names(gm: torch.nn.Module, params: bool = True) -> dict[int, str]:
    """id(tensor) -> the first name the module gives it: one name per tied parameter."""
    named = gm.named_parameters() if params else gm.named_buffers()
    return {id(t): name for name, t in named}


def block_of(module: str) -> str | None:
    """`h.3.attn.c_attn` -> `h.3`: the repeated block (a ModuleList/Sequential child) a module lies in."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return None


def group_of(module: str) -> str:
    """The block a module lies in, else its top-level module (`wte`, `ln_f`); '' for the root."""
    return block_of(module) or module.split(".")[0]


def fresh_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A deep copy whose nodes have annotations of their own: a graph's deep copy shares node.meta's
    values, so passes run on the copy would write into the original's NodeInfo."""
    with warnings.catch_warnings():  # deep-copying export's pytree specs warns about a deprecated API
        warnings.simplefilter("ignore", FutureWarning)
        copied = copy.deepcopy(gm)
    for node in copied.graph.nodes:
        ni = info(node)
        node.meta[META_KEY] = dataclasses.replace(ni, extra=dict(ni.extra))
    return copied
