"""tensor_parallel: find Megatron's plan by reading the graph, and rewrite it.

One forward walk over the graph decides, for every tensor value, whether it
is replicated (R), sharded on a dim (S) or a partial sum (P) over the tp
ranks, and rewrites the graph to compute this rank's part:

- a linear whose input is R becomes column-parallel: its weight is sharded
  over output features (`copy_to_tp` on the input: all-reduce of the gradient
  in backward), its output S(-1); if the output is split along that dim
  (fused QKV, SwiGLU's gate+up), the weight is sharded chunk by chunk;
- a linear whose input is S(-1) becomes row-parallel: weight sharded over
  input features, the partial results summed by `reduce_from_tp`, bias added
  after the sum;
- embeddings become vocab-parallel (masked local lookup + all-reduce), or
  embedding-dim parallel when the vocabulary does not divide;
- pointwise ops, views, transposes, softmax and reductions over other dims,
  matmuls and attention over sharded heads keep the shard; view sizes and
  split sizes along the sharded dim are rewritten to the local size, whether
  constants, computed values or -1; size queries of sharded tensors are
  rewritten to answer the global size, so every computed size stays global;
- anything else gets its sharded inputs gathered first (`gather_from_tp`):
  correct, and reported in `ctx.replicated` with the reason.

Decisions land in `NodeInfo.sharding` (values) and `ctx.param_shardings`
(canonical parameter name -> Sharding). The pass ends by re-running the
meta analysis with local shapes, so the pipeline split and the summary see
what one rank computes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from ...errors import GraphsplitError
from ...ir.meta import TensorSpec, canonical_names, info
from ...ir.optable import tp_family
from ...ir.sharding import P, R, S, Sharding
from ...ops import tp as tpops
from ..functionalize import functionalize_modules
from ..manager import PassContext
from .layout import (
    container_len,
    index_shard_dim,
    nearest_divisor,
    norm_dim,
    round_up,
    shape_of,
    view_shard_dim,
)
from .lookahead import (
    chunk_layout,
    column_pays_off,
    feeds_output,
    heads_views,
    view_blocking_shard,
)
from .spellings import (
    arg_of,
    describe,
    drop_linear_bias,
    is_param,
    linear_form,
    op_name_of,
    set_arg,
    set_linear_input,
    set_linear_weight,
    split_sizes,
)

aten = torch.ops.aten


# families that never create a shard: with every tensor input whole, the output is whole
_NEVER_SHARD = frozenset({"view", "expand", "repeat_interleave", "transpose", "softmax", "reduction", "split",
                          "slice", "norm", "cat", "stack", "pointwise"})


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, ctx: PassContext) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.ctx = ctx
        self.tp = ctx.plan.tp
        self.canonical = canonical_names(gm)
        self.param_shardings: dict[str, Sharding] = {}
        self.replicated: list[dict[str, str]] = []
        self._copies: dict[fx.Node, fx.Node] = {}
        self._gathers: dict[fx.Node, fx.Node] = {}
        self._comm: fx.Node | None = None

    # -- bookkeeping ---------------------------------------------------------
    def sh(self, value: Any) -> Sharding:
        if isinstance(value, fx.Node):
            found = info(value).sharding
            return found if isinstance(found, Sharding) else R
        return R

    def set(self, node: fx.Node, sharding: Any) -> None:
        info(node).sharding = sharding

    def note(self, node: fx.Node, reason: str) -> None:
        self.replicated.append({"module": info(node).module or "<root>", "node": node.name, "reason": reason})

    def _new(self, where: fx.Node, fn: Callable[..., Any], args: tuple, like: fx.Node, sharding: Sharding,
             before: bool = True, shape: tuple[int, ...] | None = None, owner: fx.Node | None = None) -> fx.Node:
        """A new call before/after `where`, shaped like `like`, attributed to `owner`'s module."""
        ctx = self.graph.inserting_before(where) if before else self.graph.inserting_after(where)
        with ctx:
            new = self.graph.call_function(fn, (*args, self.comm()))
        owner = owner or like
        _stamp(new, owner)
        src = info(like)
        spec = src.tensor if shape is None else TensorSpec(shape, src.tensor.dtype, src.tensor.requires_grad)
        ni = info(new)
        ni.value, ni.tensor, ni.module, ni.kind = "tensor", spec, info(owner).module, "collective"
        self.set(new, sharding)
        return new

    def comm(self) -> fx.Node:
        """The graph's communicator (`self.tp_comm`), the last argument of every collective."""
        if self._comm is None:
            self.gm.add_submodule(tpops.COMM_ATTR, tpops.TPComm(self.tp))
            first = next(n for n in self.graph.nodes if n.op != "placeholder")
            with self.graph.inserting_before(first):
                self._comm = self.graph.get_attr(tpops.COMM_ATTR)
            info(self._comm).value = "scalar"
        return self._comm

    def _replace_input(self, node: fx.Node, old: fx.Node, new: fx.Node) -> None:
        node.args = fx.node.map_arg(node.args, lambda n: new if n is old else n)
        node.kwargs = fx.node.map_arg(node.kwargs, lambda n: new if n is old else n)

    # -- collectives -----------------------------------------------------------
    def gathered(self, value: fx.Node, at: fx.Node, reason: str | None = None) -> fx.Node:
        """`value` made whole (R) for `at`; reuses one gather per value."""
        s = self.sh(value)
        if s.kind == "R":
            return value
        if s.kind == "P":
            new = self._new(at, tpops.reduce_from_tp, (value,), value, R)
        else:
            if s.chunks:
                raise GraphsplitError(
                    f"internal: a fused (chunked) sharded value {value.name} reaches {at.name}, which needs it whole"
                )
            new = self._gathers.get(value)
            if new is None:
                new = self._new(at, tpops.gather_from_tp, (value, s.dim), value, R)
                self._gathers[value] = new
        if reason:
            self.note(at, reason)
        return new

    def make_replicated(self, node: fx.Node, reason: str) -> None:
        """Gather every sharded tensor input of `node`; its output is then R."""
        for arg in list(node.all_input_nodes):
            if info(arg).value == "tensor" and self.sh(arg).kind != "R":
                self._replace_input(node, arg, self.gathered(arg, node))
        self.set(node, [R] * container_len(node) if info(node).value == "container" else R)
        self.note(node, reason)

    def copy_to_tp(self, value: fx.Node, at: fx.Node) -> fx.Node:
        """f before column-parallel layers; one per value, so their input gradients are
        summed by autograd first and all-reduced once."""
        spec = info(value).tensor
        if spec is None or not spec.requires_grad:
            return value  # no gradient flows back: nothing to sum
        found = self._copies.get(value)
        if found is None:
            # f belongs to the layer it feeds (Megatron's column-parallel input)
            found = self._copies[value] = self._new(at, tpops.copy_to_tp, (value,), value, R, owner=at)
        return found

    def whole(self, node: fx.Node, value: Any) -> None:
        """`value` (R) is used whole by `node`, whose output is sharded: in backward each
        rank holds only part of its gradient, so it goes through f (all-reduce of the gradient)."""
        if not isinstance(value, fx.Node) or self.sh(value).kind != "R":
            return
        spec = info(value).tensor
        if spec is None or not spec.requires_grad:
            return
        self._replace_input(node, value, self.copy_to_tp(value, node))

    def scatter(self, value: fx.Node, dim: int, at: fx.Node) -> fx.Node:
        shape = shape_of(value)
        local = list(shape) if shape else None
        if local:
            local[dim] //= self.tp
        return self._new(at, tpops.scatter_to_tp, (value, dim), value, S(dim), shape=tuple(local) if local else None)

    # -- the walk ------------------------------------------------------------
    def run(self) -> None:
        functionalize_modules(self.gm)
        self.max_heads = max(heads_views(self.graph), default=0)
        self.linear_weights = {
            self.param_name(form[1]) for n in self.graph.nodes if (form := linear_form(n)) is not None
        } - {None}
        for node in list(self.graph.nodes):
            if info(node).value == "scalar" and node.op != "output":
                fam = tp_family(node, self.gm)
                if fam == "size":
                    self.rule_size(node)
                continue
            if node.op in ("placeholder", "get_attr"):
                if info(node).sharding is None:
                    self.set(node, R)
                continue
            if node.op == "output":
                self.rule_output(node)
                continue
            fam = tp_family(node, self.gm)
            if fam in _NEVER_SHARD and all(self.sh(a) == R for a in node.all_input_nodes if info(a).value == "tensor"):
                # whole in, whole out: written once here, not at the top of every rule
                self.set(node, [R] * container_len(node) if info(node).value == "container" else R)
                continue
            rule = getattr(self, f"rule_{fam}", None)
            if rule is None:
                self.rule_unknown(node)
            else:
                rule(node)

    # -- parameters ------------------------------------------------------------
    def param_name(self, node: Any) -> str | None:
        if not isinstance(node, fx.Node) or node.op != "get_attr":
            return None
        value = self.gm.get_parameter(str(node.target)) if is_param(self.gm, node) else None
        return self.canonical.get(id(value)) if value is not None else None

    def shard_param(self, node: fx.Node, sharding: Sharding) -> bool:
        """Give the parameter read by `node` this sharding; False if it already has another."""
        name = self.param_name(node)
        if name is None:
            return False
        have = self.param_shardings.get(name)
        if have is not None and have != sharding:
            return False
        self.param_shardings[name] = sharding
        self.set(node, sharding)
        return True

    # -- rules -----------------------------------------------------------------
    def rule_output(self, node: fx.Node) -> None:
        for leaf in node.all_input_nodes:
            if self.sh(leaf).kind != "R" and info(leaf).value == "tensor":
                self._replace_input(node, leaf, self.gathered(leaf, node))

    def rule_unknown(self, node: fx.Node) -> None:
        sharded = [a for a in node.all_input_nodes if self.sh(a).kind != "R" and info(a).value == "tensor"]
        if info(node).value == "container":
            if sharded:
                for a in sharded:
                    self._replace_input(node, a, self.gathered(a, node))
                self.note(node, f"{describe(node)} is not known to keep a shard")
            self.set(node, [R] * container_len(node))
            return
        if sharded:
            for a in sharded:
                self._replace_input(node, a, self.gathered(a, node))
            self.note(node, f"{describe(node)} is not known to keep a shard")
        self.set(node, R)

    # families with no rule of their own
    rule_other = rule_param = rule_shape = rule_unknown

    def rule_identity(self, node: fx.Node) -> None:
        # type_as(other) / to(other) read only other's dtype and device: its layout does not matter
        src = node.args[0] if node.args else None
        s = self.sh(src)
        if s.kind == "P":
            self._replace_input(node, src, self.gathered(src, node))
            s = R
        self.set(node, s)

    def rule_pointwise(self, node: fx.Node) -> None:
        out_shape = shape_of(node)
        tensors = [a for a in node.all_input_nodes if info(a).value == "tensor"]
        if out_shape is None or not tensors:
            self.set(node, R)
            return
        nd = len(out_shape)
        for a in tensors:
            if self.sh(a).kind == "P":
                self._replace_input(node, a, self.gathered(a, node))
        dims = set()
        chunks = set()
        for a in tensors:
            s = self.sh(a)
            if s.kind == "S":
                dims.add(s.dim + nd - len(shape_of(a)))
                chunks.add(s.chunks)
        if not dims:
            self.set(node, R)
            return
        if len(dims) > 1 or len(chunks) > 1:
            self.make_replicated(node, f"{describe(node)} mixes values sharded on different dims")
            return
        (d,) = dims
        (c,) = chunks
        for a in tensors:
            if self.sh(a).kind == "S":
                continue
            shape = shape_of(a)
            ad = d - (nd - len(shape))
            if ad < 0 or shape[ad] == 1:
                self.whole(node, a)  # broadcast along the sharded dim: every rank uses all of it
                continue
            if c:
                self.make_replicated(node, f"{describe(node)} combines a fused sharded value with a whole one")
                return
            self._replace_input(node, a, self.scatter(a, ad, node))
        self.set(node, S(d, c))

    def rule_view(self, node: fx.Node) -> None:
        src = node.args[0]
        s = self.sh(src)
        if s.kind == "P":
            self._replace_input(node, src, self.gathered(src, node))
            self.set(node, R)
            return
        in_shape, out_shape = shape_of(src), shape_of(node)
        e = view_shard_dim(in_shape, out_shape, s.dim, self.tp)
        if e is not None and s.chunks and out_shape[e] != in_shape[s.dim]:
            e = None  # a fused dim keeps its chunk layout only if the view leaves it whole
        if e is None:
            self.make_replicated(node, f"{describe(node)} {list(in_shape)} -> {list(out_shape)} moves the sharded dim {s.dim}")
            return
        self._localize_size_args(node, out_shape, e)
        self.set(node, S(e, s.chunks))

    def _localize_size_args(self, node: fx.Node, out_shape: tuple[int, ...], e: int) -> None:
        """Rewrite the size argument of output dim `e` (constant, computed node or -1) to the local size."""
        name = op_name_of(node)
        if name in ("flatten", "squeeze", "unsqueeze", "view_as", "reshape_as"):
            if name in ("view_as", "reshape_as"):
                other = node.args[1]
                if self.sh(other) != S(e):
                    raise GraphsplitError(f"internal: {node.name} views as a differently sharded value")
            return
        if name == "unflatten":
            dim = norm_dim(arg_of(node, 1, "dim"), len(shape_of(node.args[0])))
            sizes = list(arg_of(node, 2, "sizes"))
            sizes[e - dim] = self._local_size(sizes[e - dim], node)
            set_arg(node, 2, "sizes", tuple(sizes))
            return
        # view/reshape: sizes either as varargs (Tensor.view(a, b, c)) or one list
        if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)):
            sizes = list(node.args[1])
            sizes[e] = self._local_size(sizes[e], node)
            node.args = (node.args[0], type(node.args[1])(sizes))
        elif "shape" in node.kwargs or "size" in node.kwargs:
            key = "shape" if "shape" in node.kwargs else "size"
            sizes = list(node.kwargs[key])
            sizes[e] = self._local_size(sizes[e], node)
            node.kwargs = {**node.kwargs, key: tuple(sizes)}
        else:
            args = list(node.args)
            args[1 + e] = self._local_size(args[1 + e], node)
            node.args = tuple(args)

    def _local_size(self, size: Any, at: fx.Node) -> Any:
        if isinstance(size, int):
            return size if size == -1 else size // self.tp
        if isinstance(size, fx.Node):
            with self.graph.inserting_before(at):
                new = self.graph.call_function(operator.floordiv, (size, self.tp))
            ni = info(new)
            _stamp(new, at)
            ni.value, ni.kind, ni.module = "scalar", "shape", info(at).module
            return new
        raise GraphsplitError(f"cannot rewrite the size {size!r} of {at.name} for tensor parallelism")

    def rule_expand(self, node: fx.Node) -> None:
        src = node.args[0]
        s = self.sh(src)
        if s.kind != "S":
            self.rule_identity(node)
            return
        out_shape = shape_of(node)
        e = s.dim + len(out_shape) - len(shape_of(src))
        sizes = list(node.args[1]) if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else list(node.args[1:])
        sizes[e] = self._local_size(sizes[e], node)
        node.args = (src, sizes) if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else (src, *sizes)
        self.set(node, S(e, s.chunks))

    def rule_repeat_interleave(self, node: fx.Node) -> None:
        # repeating each element in place keeps a contiguous block per rank
        src = node.args[0]
        s = self.sh(src)
        if s.kind == "S" and isinstance(arg_of(node, 1, "repeats"), int) and arg_of(node, 2, "dim") is not None:
            self.set(node, S(s.dim))
        else:
            self.make_replicated(node, f"{describe(node)} without a dim")

    def rule_transpose(self, node: fx.Node) -> None:
        src = node.args[0]
        s = self.sh(src)
        if s.kind != "S":
            self.rule_identity(node)
            return
        nd = len(shape_of(src))
        name = op_name_of(node)
        d = s.dim
        if name == "t":
            e = 1 - d if nd == 2 else d
        elif name == "permute":
            dims = list(node.args[1]) if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else list(node.args[1:])
            dims = [norm_dim(x, nd) for x in dims]
            e = dims.index(d)
        else:
            a = norm_dim(arg_of(node, 1, "dim0"), nd)
            b = norm_dim(arg_of(node, 2, "dim1"), nd)
            e = b if d == a else a if d == b else d
        self.set(node, S(e, s.chunks))

    def rule_softmax(self, node: fx.Node) -> None:
        src = node.args[0]
        s = self.sh(src)
        dim = arg_of(node, 1, "dim")
        if s.kind == "S" and dim is not None and norm_dim(dim, len(shape_of(src))) != s.dim:
            self.set(node, s)
        else:
            self.make_replicated(node, f"{describe(node)} over the sharded dim")

    def rule_reduction(self, node: fx.Node) -> None:
        src = node.args[0]
        s = self.sh(src)
        nd = len(shape_of(src))
        dim = arg_of(node, 1, "dim")
        keepdim = bool(arg_of(node, 2, "keepdim", False))
        if dim is None or s.kind != "S" or info(node).value != "tensor":
            self.make_replicated(node, f"{describe(node)} reduces over every dim")
            return
        dims = {norm_dim(x, nd) for x in (dim if isinstance(dim, (list, tuple)) else [dim])}
        if s.dim in dims:
            self.make_replicated(node, f"{describe(node)} reduces over the sharded dim")
            return
        e = s.dim if keepdim else s.dim - sum(1 for x in dims if x < s.dim)
        self.set(node, S(e))

    def rule_split(self, node: fx.Node) -> None:
        src = node.args[0]
        s = self.sh(src)
        n_out = container_len(node)
        nd = len(shape_of(src))
        name = op_name_of(node)
        dim = norm_dim(arg_of(node, 2, "dim", 0) if name != "chunk" else arg_of(node, 2, "dim", 0), nd)
        if s.kind == "S" and dim != s.dim:
            self.set(node, [S(s.dim)] * n_out)
            return
        sizes = split_sizes(node, shape_of(src)[dim])
        if s.kind == "S" and s.chunks and sizes is not None and tuple(sizes) == s.chunks:
            if name != "chunk":
                arg = node.args[1]
                new = arg // self.tp if isinstance(arg, int) else type(arg)(x // self.tp for x in arg)
                set_arg(node, 1, "split_size_or_sections", new)
            self.set(node, [S(s.dim)] * n_out)
            return
        for a in node.all_input_nodes:
            if self.sh(a).kind != "R" and not self.sh(a).chunks:
                self._replace_input(node, a, self.gathered(a, node))
            elif self.sh(a).chunks:
                raise GraphsplitError(f"internal: fused sharded value {a.name} split differently than its weight")
        self.note(node, f"{describe(node)} splits along the sharded dim")
        self.set(node, [R] * n_out)

    def rule_getitem(self, node: fx.Node) -> None:
        src, index = node.args[0], node.args[1]
        parent = info(src).sharding
        if isinstance(parent, list):
            self.set(node, parent[index] if isinstance(index, int) and index < len(parent) else R)
            return
        s = self.sh(src)
        if s.kind == "R" or info(node).value != "tensor":
            self.set(node, R)
            return
        e = index_shard_dim(index, len(shape_of(src)), s.dim)
        if e is None or s.kind != "S":
            self.make_replicated(node, f"indexing {src.name} along its sharded dim")
        else:
            self.set(node, S(e, s.chunks))

    def rule_slice(self, node: fx.Node) -> None:
        """aten.slice(x, dim, start, end, step) / aten.select(x, dim, index): keep a shard on another dim."""
        src = node.args[0]
        s = self.sh(src)
        nd = len(shape_of(src))
        dim = norm_dim(arg_of(node, 1, "dim", 0), nd)
        if s.kind != "S" or dim == s.dim:
            self.make_replicated(node, f"{describe(node)} along the sharded dim")
            return
        if op_name_of(node) == "select":
            self.set(node, S(s.dim - (1 if dim < s.dim else 0)))
        else:
            self.set(node, S(s.dim, s.chunks))

    def rule_cat(self, node: fx.Node) -> None:
        tensors = [a for a in node.all_input_nodes if info(a).value == "tensor"]
        shards = {self.sh(a) for a in tensors}
        nd = len(shape_of(node))
        dim = norm_dim(arg_of(node, 1, "dim", 0), nd)
        if len(shards) == 1 and (only := next(iter(shards))).kind == "S" and only.dim != dim and not only.chunks:
            self.set(node, only)
            return
        self.make_replicated(node, f"{describe(node)} concatenates along the sharded dim or mixes layouts")

    def rule_stack(self, node: fx.Node) -> None:
        tensors = [a for a in node.all_input_nodes if info(a).value == "tensor"]
        shards = {self.sh(a) for a in tensors}
        nd = len(shape_of(node))
        dim = norm_dim(arg_of(node, 1, "dim", 0), nd)
        if len(shards) == 1 and (only := next(iter(shards))).kind == "S" and not only.chunks:
            self.set(node, S(only.dim + (1 if only.dim >= dim else 0)))
        else:
            self.make_replicated(node, f"{describe(node)} mixes layouts")

    def rule_norm(self, node: fx.Node) -> None:
        self.make_replicated(node, f"{describe(node)} normalizes over the sharded dim")

    def rule_size(self, node: fx.Node) -> None:
        """Size queries of a sharded tensor answer the global size: computed sizes stay global."""
        src = node.args[0] if node.args else None
        if not isinstance(src, fx.Node) or self.sh(src).kind != "S":
            return
        s = self.sh(src)
        nd = len(shape_of(src))
        name = op_name_of(node)
        users = list(node.users)
        if name in ("size", "sym_size") and arg_of(node, 1, "dim") is not None:
            if norm_dim(arg_of(node, 1, "dim"), nd) != s.dim:
                return
            with self.graph.inserting_after(node):
                fixed = self.graph.call_function(operator.mul, (node, self.tp))
        elif name in ("numel", "sym_numel"):
            with self.graph.inserting_after(node):
                fixed = self.graph.call_function(operator.mul, (node, self.tp))
        elif name in ("size", "getattr"):
            with self.graph.inserting_after(node):
                fixed = self.graph.call_function(tpops.global_shape, (src, s.dim, self.comm()))
        else:
            return
        ni = info(fixed)
        _stamp(fixed, node)
        ni.value, ni.kind, ni.module = "scalar", "shape", info(node).module
        for user in users:
            self._replace_input(user, node, fixed)

    def rule_linear(self, node: fx.Node) -> None:
        form = linear_form(node)
        if form is None:
            self.rule_matmul(node)
            return
        x, w, b, out_dim, in_dim = form
        if not (isinstance(w, fx.Node) and w.op == "get_attr"):
            self.rule_matmul(node)
            return
        s = self.sh(x)
        w_shape = shape_of(w)
        out_features = w_shape[out_dim]
        if s.kind == "P":
            x = self.gathered(x, node)
            set_linear_input(node, x)
            s = R
        x_nd = len(shape_of(x))
        if s.kind == "R":
            chunks = chunk_layout(node, out_features)
            ok = out_features % self.tp == 0 and (chunks is None or all(c % self.tp == 0 for c in chunks))
            # asked even when the features do not divide: a fused QKV whose chunks do not divide is
            # attention whose heads do not, and that is refused, not quietly left whole
            blocker = view_blocking_shard(node, self.tp)
            if blocker is not None:
                heads, why = blocker
                if heads >= self.max_heads:  # the query heads must split; fewer kv heads may stay whole
                    valid = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
                    raise GraphsplitError(
                        f"attention in '{info(node).module or '<root>'}': {heads} heads cannot be split over "
                        f"tp={self.tp}; use tp={nearest_divisor(heads, self.tp)} (tp must divide the number of "
                        f"heads: {valid})"
                    )
                self.note(node, f"linear left replicated: {why}")
                self.set(node, R)
                return
            if ok and not column_pays_off(node, self.gm):
                self.note(node, "linear left replicated: its sharded output would be gathered before any "
                                "row-parallel layer (a norm or reduction comes first)")
                self.set(node, R)
                return
            if not ok and feeds_output(node, self.gm):
                raise GraphsplitError(
                    f"output layer '{info(node).module or node.name}': {out_features} output features (the vocabulary) "
                    f"cannot be split over tp={self.tp}; pad it to {round_up(out_features, self.tp)} "
                    f"or use tp={nearest_divisor(out_features, self.tp)}"
                )
            have = self.param_shardings.get(self.param_name(w) or "")
            if ok and (have is None or have == S(out_dim, chunks)):
                self.shard_param(w, S(out_dim, chunks))
                if b is not None:
                    self.shard_param(b, S(0, chunks))
                set_linear_input(node, self.copy_to_tp(x, node))
                self.set(node, S(len(shape_of(node)) - 1, chunks))
                return
            if out_features % self.tp:
                why = f"out features {out_features} not divisible by tp={self.tp}"
            elif not ok:
                why = f"its fused chunks of {', '.join(map(str, chunks or ()))} features are not divisible by tp={self.tp}"
            else:
                why = f"its weight is already sharded as {have}"
            self.note(node, f"linear left replicated: {why}")
            if have is not None and have.kind == "S":
                set_linear_weight(node, self.gathered(w, node))
            self.set(node, R)
            return
        if s.dim == x_nd - 1:
            want = S(in_dim, s.chunks)
            have = self.param_shardings.get(self.param_name(w) or "")
            if have is None or have == want:
                self.shard_param(w, want)
                out = self._row_parallel(node, b)
                self.set(out, R)
                return
            self.make_replicated(node, f"linear weight already sharded as {have}")
            return
        # sharded on a leading (batch-like) dim: every rank applies the whole weight to its rows
        if self.param_shardings.get(self.param_name(w) or "", R) != R:
            set_linear_weight(node, self.gathered(w, node))
        else:
            self.whole(node, w)
            if b is not None:
                self.whole(node, b)
        self.set(node, S(s.dim))

    def _row_parallel(self, node: fx.Node, bias: fx.Node | None) -> fx.Node:
        """Drop the bias from the local matmul, sum the partials, add the bias once."""
        if bias is not None:
            drop_linear_bias(node)
        self.set(node, P)
        users = [u for u in node.users]
        reduced = self._new(node, tpops.reduce_from_tp, (node,), node, R, before=False)
        last = reduced
        if bias is not None:
            with self.graph.inserting_after(reduced):
                last = self.graph.call_function(operator.add, (reduced, bias))
            _stamp(last, node)
            li = info(last)
            li.value, li.tensor, li.module, li.kind = "tensor", info(node).tensor, info(node).module, "other"
            self.set(last, R)
        for user in users:
            self._replace_input(user, node, last)
        return last

    def rule_embedding(self, node: fx.Node) -> None:
        if node.op == "call_function" and node.target in (F.embedding,):
            ids, w = node.args[0], node.args[1]
        elif isinstance(node.target, torch._ops.OpOverload):
            w, ids = node.args[0], node.args[1]
        else:
            self.rule_unknown(node)
            return
        if not (isinstance(w, fx.Node) and w.op == "get_attr"):
            self.rule_unknown(node)
            return
        if self.sh(ids).kind != "R":
            self._replace_input(node, ids, self.gathered(ids, node))
        vocab, width = shape_of(w)
        have = self.param_shardings.get(self.param_name(w) or "")
        padding = node.kwargs.get("padding_idx", node.args[2] if len(node.args) > 2 else None)
        padding = None if padding is not None and (not isinstance(padding, int) or padding < 0) else padding
        if (have is None and vocab % self.tp == 0) or have == S(0):
            self.shard_param(w, S(0))
            with self.graph.inserting_before(node):
                new = self.graph.call_function(tpops.vocab_parallel_embedding, (ids, w, padding, self.comm()))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            self.graph.erase_node(node)
            self.set(new, R)
            return
        if vocab % self.tp and self.param_name(w) in self.linear_weights:
            raise GraphsplitError(
                f"embedding '{info(node).module or w.target}': vocabulary {vocab} cannot be split over tp={self.tp} "
                f"and its weight is tied to an output layer; pad the vocabulary to {round_up(vocab, self.tp)} "
                f"or use tp={nearest_divisor(vocab, self.tp)}"
            )
        if (have is None and width % self.tp == 0) or have == S(1):
            self.shard_param(w, S(1))
            self.set(node, S(len(shape_of(node)) - 1))
            return
        self.note(node, f"embedding left replicated: neither vocabulary {vocab} nor width {width} divisible by tp={self.tp}")
        self.set(node, R)

    def rule_cross_entropy(self, node: fx.Node) -> None:
        """Cross-entropy over vocab-sharded logits: three small all-reduces instead of a gather."""
        x, target = node.args[0], arg_of(node, 1, "target")
        s = self.sh(x)
        simple = (
            s.kind == "S" and not s.chunks and len(shape_of(x)) == 2 and s.dim == 1
            and arg_of(node, 2, "weight") is None and not arg_of(node, 7, "label_smoothing", 0.0)
            and arg_of(node, 6, "reduction", "mean") in ("mean", "sum", "none")
            and isinstance(target, fx.Node) and self.sh(target).kind == "R"
        )
        if not simple:
            self.rule_unknown(node)
            return
        with self.graph.inserting_before(node):
            new = self.graph.call_function(
                tpops.vocab_parallel_cross_entropy,
                (x, target, arg_of(node, 4, "ignore_index", -100), arg_of(node, 6, "reduction", "mean"), self.comm()),
            )
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.set(new, R)

    def rule_matmul(self, node: fx.Node) -> None:
        a, b = node.args[0], node.args[1]
        sa, sb = self.sh(a), self.sh(b)
        if sa.kind == "P" or sb.kind == "P":
            self.make_replicated(node, "matmul of a partial sum")
            return
        if sa.kind == "R" and sb.kind == "R":
            self.set(node, R)
            return
        ashape, bshape, oshape = shape_of(a), shape_of(b), shape_of(node)
        if len(ashape) < 2 or len(bshape) < 2 or sa.chunks or sb.chunks:
            self.make_replicated(node, f"{describe(node)} on vectors or fused shards")
            return
        na, nb, no = len(ashape), len(bshape), len(oshape)
        # batch dims aligned from the right of the batch part
        def out_of(x_dim: int, nx: int) -> int:
            return x_dim + (no - nx)

        if sa.kind == "S" and sa.dim < na - 2:
            e = out_of(sa.dim, na)
            if sb.kind == "S" and out_of(sb.dim, nb) != e:
                self.make_replicated(node, "matmul of differently sharded batches")
                return
            if sb.kind == "R":
                bd = e - (no - nb)
                if bd >= 0 and bshape[bd] != 1:
                    self._replace_input(node, b, self.scatter(b, bd, node))
                else:
                    self.whole(node, b)
            self.set(node, S(e))
            return
        if sb.kind == "S" and sb.dim < nb - 2:
            e = out_of(sb.dim, nb)
            ad = e - (no - na)
            if ad >= 0 and ashape[ad] != 1:
                self._replace_input(node, a, self.scatter(a, ad, node))
            else:
                self.whole(node, a)
            self.set(node, S(e))
            return
        if sa.kind == "S" and sa.dim == na - 2 and sb.kind == "R":
            self.whole(node, b)
            self.set(node, S(no - 2))
            return
        if sb.kind == "S" and sb.dim == nb - 1 and sa.kind == "R":
            self.whole(node, a)
            self.set(node, S(no - 1))
            return
        if sa.kind == "S" and sa.dim == na - 1 and sb.kind == "S" and sb.dim == nb - 2:
            self.set(node, P)
            users = list(node.users)
            reduced = self._new(node, tpops.reduce_from_tp, (node,), node, R, before=False)
            for user in users:
                self._replace_input(user, node, reduced)
            return
        self.make_replicated(node, f"{describe(node)} with operands sharded as {sa} and {sb}")

    def rule_attention(self, node: fx.Node) -> None:
        if node.op == "call_module":
            self.rule_unknown(node)
            return
        q, k, v = node.args[0], node.args[1], node.args[2]
        shards = [self.sh(t) for t in (q, k, v)]
        if all(s.kind == "R" for s in shards):
            mask = arg_of(node, 3, "attn_mask")
            if isinstance(mask, fx.Node) and self.sh(mask).kind != "R":
                self._replace_input(node, mask, self.gathered(mask, node))
            self.set(node, R)
            return
        heads = [s.dim for s in shards if s.kind == "S"]
        qs = shape_of(q)
        head_dim = len(qs) - 3
        if any(d != head_dim for d in heads) or any(s.kind == "P" or s.chunks for s in shards):
            self.make_replicated(node, "attention sharded on a dim other than heads")
            return
        for t in (q, k, v):
            if self.sh(t).kind == "R":
                shape = shape_of(t)
                if shape[head_dim] % self.tp:
                    self.make_replicated(node, f"attention: {shape[head_dim]} heads not divisible by tp={self.tp}")
                    return
                self._replace_input(node, t, self.scatter(t, head_dim, node))
        mask = arg_of(node, 3, "attn_mask")
        if isinstance(mask, fx.Node):
            ms = shape_of(mask)
            md = head_dim - (len(qs) - len(ms))
            if self.sh(mask).kind == "S":
                if self.sh(mask).dim != md:
                    self._replace_input(node, mask, self.gathered(mask, node))
                    mask = node.args[3] if len(node.args) > 3 else node.kwargs["attn_mask"]
            if self.sh(mask).kind == "R" and md >= 0 and ms[md] != 1:
                self._replace_input(node, mask, self.scatter(mask, md, node))
            elif self.sh(mask).kind == "R":
                self.whole(node, mask)
        self.set(node, S(head_dim))


# --- helpers over op spellings -------------------------------------------------


def _stamp(new: fx.Node, like: fx.Node) -> None:
    """A node the pass adds belongs to the module of the node it serves (re-analysis reads this)."""
    new.meta.update({k: v for k, v in like.meta.items() if k in ("nn_module_stack", "stack_trace")})


def rewrite_loss(loss_gm: fx.GraphModule, ctx: PassContext, input_shardings: dict[int, Sharding]) -> bool:
    """Rewrite a traced loss whose inputs `input_shardings` (placeholder index -> S) stay
    sharded; True if every sharded input is consumed without a gather (vocab-parallel CE)."""
    placeholders = [n for n in loss_gm.graph.nodes if n.op == "placeholder"]
    for i, sharding in input_shardings.items():
        info(placeholders[i]).sharding = sharding
    rewriter = _Rewriter(loss_gm, ctx)
    rewriter.run()
    loss_gm.graph.lint()
    loss_gm.recompile()
    gathered = any(n.target is tpops.gather_from_tp for n in loss_gm.graph.nodes if n.op == "call_function")
    fused = any(n.target is tpops.vocab_parallel_cross_entropy for n in loss_gm.graph.nodes if n.op == "call_function")
    return fused and not gathered


def tensor_parallel_pass(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    if ctx.plan.tp == 1:
        return gm
    rewriter = _Rewriter(gm, ctx)
    rewriter.run()
    gm.graph.lint()
    gm.recompile()
    ctx.param_shardings = rewriter.param_shardings
    ctx.replicated = rewriter.replicated
    from ...analysis.shapes import annotate

    # what one rank computes: local shapes, FLOPs and bytes
    annotate(gm, ctx.inputs, param_shardings=rewriter.param_shardings, tp=ctx.plan.tp)
    return gm
