"""Shape, dtype, FLOPs and bytes for every node, computed on the `meta` device.

`annotate(gm, inputs)` runs the graph once on meta tensors (no weight memory:
an 80-layer 65B model takes seconds) counting FLOPs by `torch.utils.flop_counter`'s formulas
(flop_count.py), and writes each node's findings into its `NodeInfo`.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..errors import GraphsplitError
from ..ir.cpu_stand_ins import on_cpu_stand_ins, runs_on_cpu
from ..ir.devices import meta_sizes
from ..ir.fast_meta import FastMetaPointwise
from ..ir.meta import TensorSpec, info, module_path
from ..ir.module_state import left_as_found
from ..ir.op_kinds import OpKind, classify, family, sizes_from_data, writes_into
from ..ir.size_conditions import DECIDED
from .flop_count import FlopCount
from .fused_attention import FusedAttention
from .repeated_blocks import BlockSkipper, canonical, repeated_blocks

_MAYBE_FLOPS = re.compile(r"mm|conv|einsum|matmul|linear|attention|baddbmm|addbmm", re.IGNORECASE)


def _name(n: fx.Node) -> str:
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _value_kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value)):
        return "container"
    return "scalar"


def _tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


def _returns_its_input(n: fx.Node, gm: fx.GraphModule, value: Any, inputs: list[Any]) -> bool:
    """An identity-family op (the op table's) that had nothing to do: a cast to the dtype a tensor has
    (`.float()` of an fp32 one, autocast's `.to(torch.float32)` before a norm), a `contiguous()` of a
    contiguous one. torch returns the input itself, and no kernel runs (an in-place op returns its input
    too, but reads and writes it: it is not of that family)."""
    if not isinstance(value, torch.Tensor) or not any(t is value for t in inputs):
        return False
    return n.op in ("call_method", "call_function") and family(n, gm) == OpKind.IDENTITY


# what `_MetaAnnotator` sets on a node beside its module path
_ANNOTATED = ("kind", "value", "tensor", "flops", "sizes_follow_data", "param_bytes", "bytes_moved")


def _as_twin(node: fx.Node, twin: fx.Node) -> None:
    ni, found = info(node), info(twin)
    for name in _ANNOTATED:
        setattr(ni, name, getattr(found, name))
    ni.module = module_path(node)


class _MetaAnnotator(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, counter: FlopCount, skipper: BlockSkipper | None = None) -> None:
        super().__init__(gm, garbage_collect_values=True)
        # our error names the node and the shapes; fx's "While executing ..." lines would only repeat it
        self.extra_traceback = False
        self.counter = counter
        self.modules = dict(gm.named_modules())
        self.skipper = skipper

    def run_node(self, n: fx.Node) -> Any:
        # a later repeated block: its twin in block 2 answers
        return self.skipper.step(n, self._annotate, _as_twin) if self.skipper is not None else self._annotate(n)

    def _annotate(self, n: fx.Node) -> Any:
        kind = classify(n, self.module)
        # the counter intercepts every op it sees; only ops that can do matmul-class
        # work are run under it (elementwise ops count 0 FLOPs there anyway).
        counting = kind.compute or n.op == "call_module" or bool(_MAYBE_FLOPS.search(_name(n)))
        # each op in the grad mode the model ran it in: a no_grad op's output needs no gradient
        # (passes/grad_mode.py makes the program compute just that)
        mode = torch.enable_grad() if info(n).grad_enabled else torch.no_grad()
        try:
            if counting:
                with self.counter, mode:
                    value = super().run_node(n)
            else:
                with mode:
                    value = super().run_node(n)
        except GraphsplitError:
            raise
        except Exception as exc:
            raise self._failed(n, exc) from exc
        ni = info(n)
        ni.kind = kind
        ni.module = module_path(n)
        ni.value = _value_kind(value)
        # entering the counter resets it: the total is this node's
        ni.flops = int(self.counter.get_total_flops()) if counting else 0
        if kind == OpKind.GROUPED_LINEAR and not ni.flops and isinstance(value, torch.Tensor):
            # torch's counter has no formula for a grouped matmul (HF's is a custom op): each row
            # goes through its one expert, x [S, in] -> [S, out]
            rows = self.env.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
            if isinstance(rows, torch.Tensor) and rows.dim() == 2:
                ni.flops = 2 * rows.shape[0] * rows.shape[1] * value.shape[-1]
        if isinstance(value, torch.Tensor):
            ni.tensor = TensorSpec(tuple(value.shape), value.dtype, bool(value.requires_grad))
        ni.sizes_follow_data = self._follows_data(n, value)
        if n.op == "get_attr":
            ni.param_bytes = _tensor_bytes(value)
        elif n.op == "call_module":
            mod = self.modules[str(n.target)]
            ni.param_bytes = sum(p.numel() * p.element_size() for p in mod.parameters())
        # Shape queries and views read no memory; everything else reads its inputs and
        # writes its output (a roofline's memory term).
        if n.op not in ("placeholder", "get_attr", "output") and ni.value != "scalar" and ni.kind != OpKind.VIEW:
            ins = [self.env[a] for a in n.all_input_nodes if a in self.env]
            if not _returns_its_input(n, self.module, value, ins):
                ni.bytes_moved = _tensor_bytes(ins) + _tensor_bytes(value) + ni.param_bytes
        return value


    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return super().call_module(target, args, kwargs)
        except Exception as exc:
            module = self.fetch_attr(str(target))
            if not runs_on_cpu(module, args, kwargs, exc):
                raise
            return on_cpu_stand_ins(module, args, kwargs)  # a module that reads values: its shapes on CPU

    def _follows_data(self, n: fx.Node, value: Any) -> bool:
        """Whether `n`'s output shape follows the data: made so (a nonzero, a boolean mask's selection), or
        computed from such a value by an op that keeps it (not one writing into a tensor of its own, not a
        value of one element)."""
        inputs = n.all_input_nodes
        bool_index = any(isinstance(v := self.env.get(a), torch.Tensor) and v.dtype == torch.bool for a in inputs[1:])
        if sizes_from_data(n, bool_index):
            return True
        if writes_into(n):
            first = n.args[0] if n.args else None
            return isinstance(first, fx.Node) and info(first).sizes_follow_data
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return False
        return any(info(a).sizes_follow_data for a in inputs)

    def _failed(self, n: fx.Node, exc: Exception) -> GraphsplitError:
        """What failed, on which shapes, where in the model's code, and what to change."""
        what = _name(n) if n.op != "call_module" else type(self.modules[str(n.target)]).__name__
        module = module_path(n)
        shapes = [tuple(v.shape) for a in n.all_input_nodes if isinstance(v := self.env.get(a), torch.Tensor)]
        src = info(n).source
        at = f" at {src}" if src is not None else ""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if info(n).extra.get(DECIDED):  # a condition decided while tracing, decided otherwise here
            return GraphsplitError(f"{message}{f' (in module {module!r})' if module else ''}")
        if "Sparse" in message:  # torch has no meta kernel for this op on sparse tensors
            return GraphsplitError(
                f"{what} in module '{module or '<root>'}'{at} takes a sparse tensor, and graphsplit analyses the model "
                "on meta tensors, where torch has no sparse kernel for it: models with sparse inputs or weights are "
                "not supported yet; give a dense tensor (to_dense()) or run this model unsplit")
        return GraphsplitError(
            f"{what} in module '{module or '<root>'}'{at} fails on input shape(s) "
            f"{', '.join(map(str, shapes)) or '(none)'}: {type(exc).__name__}: {message}; "
            "make example_inputs() give the shapes and dtypes this model expects (or fix the model there)"
        )


def annotate(
    gm: fx.GraphModule,
    inputs: tuple[torch.Tensor, ...],
    param_shardings: dict[str, Any] | None = None,
    tp: int = 1,
) -> None:
    """Fill every node's NodeInfo (shape, dtype, value kind, FLOPs, bytes, module).

    With `param_shardings` (canonical name -> Shard) the graph is one tp
    rank's: parameters take their local shapes and tp collectives are
    simulated (the graph's unbound TPComm), so the figures are what one rank computes.
    """
    meta_inputs = tuple(t.to("meta") for t in inputs)
    # Parameters may be real (a user's CPU model): run on meta copies, so analysis never
    # touches weight memory, and never changes the user's modules.
    needs_copy = bool(param_shardings) or not _all_meta(gm)
    on_meta = meta_copy(gm, param_shardings or {}, tp) if needs_copy else gm
    # sizes that follow the data at their largest (every element counted); attention's shape and FLOPs
    # from the fused kernel's meta function; plain pointwise ops answered below the FLOP counter
    # repeated blocks answered by the third one's twins where they are a fixed point (analysis/repeated_blocks.py);
    # not on one tp rank's graph, whose blocks may hold their weights sharded differently
    skipper = None if param_shardings else _block_skipper(on_meta)
    # left_as_found: what a module run as written wrote to itself on CPU stand-ins (ir/cpu_stand_ins.py) goes
    with FastMetaPointwise(), meta_sizes(), FusedAttention(on_meta=True), left_as_found(on_meta):
        _MetaAnnotator(on_meta, FlopCount(), skipper).run(*meta_inputs)  # on gm's own nodes


def _block_skipper(gm: fx.GraphModule) -> BlockSkipper | None:
    run = repeated_blocks(gm)
    if run is None or any(info(op).grad_enabled != info(run.blocks[2][i]).grad_enabled
                          for block in run.blocks[3:] for i, op in enumerate(block)):
        return None
    return BlockSkipper(run, lambda v: canonical(v, lambda t: t.requires_grad))


class _MetaRunner(fx.Interpreter):
    """Runs a graph on meta tensors as the analysis does: a module that reads its inputs' values runs on
    CPU stand-ins of the same shapes (ir/cpu_stand_ins.py)."""

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return super().call_module(target, args, kwargs)
        except Exception as exc:
            module = self.fetch_attr(str(target))
            if not runs_on_cpu(module, args, kwargs, exc):
                raise
            return on_cpu_stand_ins(module, args, kwargs)


def run_on_meta(gm: fx.GraphModule, *inputs: Any) -> Any:
    """`gm(*inputs)` on meta tensors (gm's own, on meta already), as the analysis runs it."""
    with meta_sizes(), left_as_found(gm):
        return _MetaRunner(gm).run(*inputs)


def _all_meta(gm: fx.GraphModule) -> bool:
    return all(t.device.type == "meta" for t in _tensors(gm))


def _tensors(gm: fx.GraphModule) -> list[torch.Tensor]:
    """Parameters, buffers, and the tensor constants the graph reads (export lifts a
    `torch.tensor(...)` made in forward into a plain attribute): all go to meta for analysis."""
    found = {id(t): t for t in (*gm.parameters(), *gm.buffers())}
    for sub in gm.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            if node.op == "get_attr":
                owner, _, attr = str(node.target).rpartition(".")
                value = getattr(sub.get_submodule(owner) if owner else sub, attr, None)
                if isinstance(value, torch.Tensor):
                    found.setdefault(id(value), value)
    return list(found.values())


def meta_copy(
    gm: fx.GraphModule, param_shardings: dict[str, Any], tp: int, names: dict[int, str] | None = None
) -> fx.GraphModule:
    """A copy of `gm` on meta whose sharded parameters have one tp rank's shape, for running it (on
    meta) without touching gm's tensors. The copy runs gm's own graph: copying a graph node by node
    costs more than the run on meta (the planner makes dozens of these), and no caller changes it.

    `names` maps id(tensor) to its canonical name (default: gm's own first names)."""
    import copy

    from ..ir.meta import canonical_names
    from ..ir.sharding import local_shape

    names = names if names is not None else canonical_names(gm)
    memo: dict[int, Any] = {}
    for t in _tensors(gm):
        sharding = param_shardings.get(names.get(id(t), ""))
        shape = local_shape(tuple(t.shape), sharding, tp) if sharding is not None else tuple(t.shape)
        meta_t = torch.empty(shape, dtype=t.dtype, device="meta")
        if isinstance(t, torch.nn.Parameter):
            meta_t = torch.nn.Parameter(meta_t, requires_grad=t.requires_grad)
        memo[id(t)] = meta_t
    graph = gm.graph
    memo[id(graph)] = graph  # shared, not copied
    with warnings.catch_warnings():  # deep-copying export's pytree specs warns about a deprecated API
        warnings.simplefilter("ignore", FutureWarning)
        copied = copy.deepcopy(gm, memo)
    graph.owning_module = gm  # the copy's construction claimed it; gm's passes look modules up through it
    return copied  # what runs on it is annotated in gm's own nodes
