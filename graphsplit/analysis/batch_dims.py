"""Which dim of each input, target and output carries the batch: found, not assumed.

Every dim of every input tensor gets a label (an atom). The program runs once on meta tensors,
its loss too, under a dispatch mode that sees each ATen op and relates the labels of its inputs
and outputs, as einsum letters: dims an op lines up (broadcasting, a matmul's batch dims, an
embedding's indices and its output rows) join one class (union-find); a dim an op mixes across
(contracted by a matmul, normalized, softmaxed, convolved, sliced, reshaped apart, reduced while
the rest stays) is coupled; a dim that lines up with a weight's (a bias, a position table) is fixed.

The batch is the class no op couples and no weight fixes, found in the most inputs: cutting the
inputs along it commutes with every op up to the loss, so micro-batches and replicas compute what
the whole batch does. A seq-first transformer's batch is its dim 1 (attention couples dim 0); the
position ids of a diffusion transformer carry none (they go whole to every piece); a graph whose
nodes attend to each other has no batch (one micro-batch, no dp replicas). BatchNorm in training
couples the batch by its statistics, as every data-parallel trainer does: named, not refused.

Why ATen and not the fx graph: one spelling per op (nn.Linear, F.linear and x @ w.T all arrive as
mm or addmm), leaf modules (nn.TransformerEncoder) are seen inside, and the user's loss_fn runs
under the same mode without being traced.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import GraphsplitError
from ..ir.batch import BatchDims
from ..ir.meta import SourceLine, info

aten = torch.ops.aten

Label = tuple[int, ...]  # one dim: the atoms it holds, outermost first; () for a size-1 dim


class _Atoms:
    """Union-find over dim atoms with what is known of each class."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.fixed: list[bool] = []  # a weight's, a buffer's or a constant's dim
        self.origin: list[int | None] = []  # the atom it was split from
        self.children: dict[int, tuple[int, ...]] = {}
        self.coupled: dict[int, str] = {}  # atom -> why (first reason), resolved through find()
        # mixed only by indexing with computed indices (a mixture of experts routes each token's row out
        # and back): per-row in every model seen, but not provable from shapes: the batch when no
        # other dim is, said as assumed
        self.routed: dict[int, str] = {}
        self.inputs: set[int] = set()  # atoms of the inputs' and target's dims
        # a dim made in forward (zeros(B * T, C), a repeat to B * heads) that lines up with merged
        # dims stands for them: root -> those atoms
        self.alias: dict[int, tuple[int, ...]] = {}
        self.iota: set[int] = set()  # atoms of an arange(n) from 0 by 1: indexing with it picks every row

    def new(self, size: int, fixed: bool = False, origin: int | None = None) -> int:
        self.parent.append(len(self.parent))
        self.size.append(size)
        self.fixed.append(fixed)
        self.origin.append(origin)
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.fixed[ra] = self.fixed[ra] or self.fixed[rb]
            for reasons in (self.coupled, self.routed):
                if rb in reasons:
                    reasons.setdefault(ra, reasons.pop(rb))

    def couple(self, a: int, why: str, routed: bool = False) -> None:
        (self.routed if routed else self.coupled).setdefault(self.find(a), why)

    def routed_by(self, a: int) -> str | None:
        return self.routed.get(self.find(a))

    def why_not(self, a: int) -> str | None:
        """Why atom `a`'s class cannot be cut (None: it can)."""
        seen = a
        while True:
            root = self.find(seen)
            if root in self.coupled:
                return self.coupled[root]
            if self.fixed[root]:
                return "lines up with a weight's or buffer's dim"
            origin = self.origin[seen]
            if origin is None:
                return None
            seen = origin


@dataclass
class _Value:
    labels: tuple[Label, ...]
    reduced: frozenset[int] = frozenset()  # atoms a full reduction summed over on the way here


@dataclass
class Decision:
    """What discovery found: per input name, per target leaf and per output leaf the batch dim
    (None: no batch there), the batch size, and why other dims were not the batch."""

    inputs: dict[str, int | None]
    target: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    size: int  # the example's batch size (0: no batch)
    coupling: list[str] = field(default_factory=list)  # "BatchNorm ...": couples the batch, named
    unproven: list[str] = field(default_factory=list)  # ops assumed to keep samples apart
    why_none: str = ""  # with no batch: why dim 0 of the first input is not one


class _Discovery(TorchDispatchMode):
    """Relates the labels of each ATen op's inputs and outputs (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.atoms = _Atoms()
        self.values: dict[int, tuple[torch.Tensor, _Value]] = {}  # id -> (tensor kept alive, value)
        self.where: Callable[[], str] = lambda: ""
        self.batch_norms: list[str] = []
        self.unproven: dict[str, None] = {}
        self.read: set[int] = set()  # ids of the tensors some op took

    # -- labels of tensors ----------------------------------------------------------------------

    def label_input(self, t: torch.Tensor) -> tuple[int, ...]:
        atoms = tuple(self.atoms.new(s) if s > 1 else -1 for s in t.shape)
        self.atoms.inputs.update(a for a in atoms if a >= 0)
        self.values[id(t)] = (t, _Value(tuple((a,) if a >= 0 else () for a in atoms)))
        return atoms

    def value(self, t: torch.Tensor) -> _Value:
        held = self.values.get(id(t))
        if held is not None and held[0] is t:
            return held[1]
        # a tensor no op made here: a weight, a buffer, a constant: its dims are fixed
        v = _Value(tuple((self.atoms.new(s, fixed=True),) if s > 1 else () for s in t.shape))
        self.values[id(t)] = (t, v)
        return v

    def set(self, t: Any, labels: Sequence[Label], reduced: frozenset[int] = frozenset()) -> None:
        if isinstance(t, torch.Tensor):
            self.values[id(t)] = (t, _Value(tuple(labels), reduced))

    def fresh(self, t: torch.Tensor, reduced: frozenset[int] = frozenset()) -> None:
        self.set(t, [(self.atoms.new(s),) if s > 1 else () for s in t.shape], reduced)

    def couple_label(self, label: Label, why: str, routed: bool = False) -> None:
        for a in label:
            self.atoms.couple(a, why, routed)

    def expand(self, label: Label) -> Label:
        """`label` with each made dim that stands for merged dims replaced by them."""
        out: list[int] = []
        for a in label:
            held = self.atoms.alias.get(self.atoms.find(a))
            out.extend(self.expand(held) if held is not None else (a,))
        return tuple(out)

    def made(self, label: Label) -> bool:
        """One dim made in forward (not an input's, not a weight's)."""
        if len(label) != 1:
            return False
        root = self.atoms.find(label[0])
        return not self.atoms.fixed[root] and not any(self.atoms.find(i) == root for i in self.atoms.inputs)

    def unify(self, a: Label, b: Label) -> Label:
        """Two dims the op lines up; returns the one label they now share."""
        a, b = self.whole(self.expand(a)), self.whole(self.expand(b))
        if not a or not b:
            return a or b
        size = self.atoms.size
        if len(a) != len(b) and math.prod(size[x] for x in a) == math.prod(size[x] for x in b):
            for one, many in ((a, b), (b, a)):
                if len(one) == 1 and len(many) > 1 and self.made(one):
                    self.atoms.alias[self.atoms.find(one[0])] = many
                    return many
        if len(a) == len(b) and all(self.atoms.size[x] == self.atoms.size[y] for x, y in zip(a, b)):
            for x, y in zip(a, b):
                self.atoms.union(x, y)
            return a
        # one dim factored two ways ([B, 4 heads] and [B, 2 kv heads, 2 repeats]): the atoms that
        # match from either end line up, the ones between are mixed
        size = self.atoms.size
        i = 0
        while i < min(len(a), len(b)) and size[a[i]] == size[b[i]]:
            self.atoms.union(a[i], b[i])
            i += 1
        j = 0
        while j < min(len(a), len(b)) - i and size[a[-1 - j]] == size[b[-1 - j]]:
            self.atoms.union(a[-1 - j], b[-1 - j])
            j += 1
        why = f"its dims are merged in another order at {self.where()}"
        self.couple_label(a[i:len(a) - j], why)
        self.couple_label(b[i:len(b) - j], why)
        return a

    def whole(self, label: Label) -> Label:
        """A label whose atoms are exactly the pieces of one split atom, as that atom."""
        if len(label) > 1:
            origin = self.atoms.origin[label[0]]
            if origin is not None and self.atoms.children.get(origin) == label:
                return self.whole((origin,))
        return label

    # -- the dispatch -------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.relate(func, args, kwargs, out)
        except Exception as exc:  # a rule that met what it did not expect: assume nothing across it
            self.unknown(func, args, out, f"{type(exc).__name__}")
        return out

    def tensors_in(self, args: Any, kwargs: Any) -> list[torch.Tensor]:
        return [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]

    def reduced_in(self, args: Any, kwargs: Any) -> frozenset[int]:
        found: frozenset[int] = frozenset()
        for t in self.tensors_in(args, kwargs):
            found |= self.value(t).reduced
        return found

    def relate(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = func.overloadpacket.__name__ if isinstance(func, torch._ops.OpOverload) else str(func)
        bare = name.rstrip("_") if not name.startswith("_") else name
        taint = self.reduced_in(args, kwargs)
        self.read.update(id(t) for t in self.tensors_in(args, kwargs))
        rule = _RULES.get(bare) or _RULES.get(name)
        if rule is None and isinstance(func, torch._ops.OpOverload) and torch.Tag.pointwise in func.tags:
            rule = _pointwise
        if rule is None:
            self.unknown(func, args, out, "")
        else:
            rule(self, func, args, kwargs, out)
        # a value summed over the batch meeting values that still hold it: samples are coupled
        if taint:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    v = self.value(t)
                    held = {self.atoms.find(a) for label in v.labels for a in label}
                    for a in taint:
                        if self.atoms.find(a) in held:
                            self.atoms.couple(a, f"a sum over it meets it again at {self.where()}")
                    self.set(t, v.labels, v.reduced | taint)
        if isinstance(func, torch._ops.OpOverload) and func._schema.is_mutable and args \
                and isinstance(args[0], torch.Tensor) and out is not args[0] and isinstance(out, torch.Tensor):
            self.set(args[0], self.value(out).labels, self.value(out).reduced)

    def unknown(self, func: Any, args: Any, out: Any, why: str) -> None:
        """No rule: an output shaped like the first input keeps its labels (assumed, and said);
        anything else gets fresh dims, and the inputs' dims it does not keep are coupled."""
        first = next((t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)), None)
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if first is None:
            for t in outs:
                self.fresh(t)
            return
        fv = self.value(first)
        kept = False
        for t in outs:
            if t.shape == first.shape:
                self.set(t, fv.labels, fv.reduced)
                kept = True
            else:
                self.fresh(t, fv.reduced)
        op = getattr(func, "__name__", str(func))
        if kept and any(fv.labels):
            self.unproven[f"{op} at {self.where()}" + (f" ({why})" if why else "")] = None
        if not kept:
            for label in fv.labels:
                self.couple_label(label, f"{op} at {self.where()}")


# -- rules, one per op family -------------------------------------------------------------------

Rule = Callable[[_Discovery, Any, tuple[Any, ...], dict[str, Any], Any], None]


def _arg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return a.default_value if a.has_default_value() else default
    return default


def _dims(value: Any, ndim: int) -> list[int]:
    if value is None:
        return list(range(ndim))
    if isinstance(value, int):
        value = [value]
    return sorted({d % ndim for d in value}) if ndim else []


def _broadcast(d: _Discovery, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> list[Label]:
    """Right-aligned broadcasting: dims of the output's size line up; size-1 dims do not."""
    labels: list[Label] = []
    for pos in range(out.dim()):
        shared: Label = ()
        for t in tensors:
            k = pos - (out.dim() - t.dim())
            if k < 0 or t.shape[k] == 1 or t.shape[k] != out.shape[pos]:
                continue
            shared = d.unify(shared, d.value(t).labels[k]) if shared else d.whole(d.value(t).labels[k])
        labels.append(shared if out.shape[pos] > 1 else ())
    return labels


def _pointwise(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = d.tensors_in(args, kwargs)
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            labels = _broadcast(d, [x for x in tensors if x.dim() <= t.dim()], t)
            d.set(t, [lab if lab or s == 1 else (d.atoms.new(s),) for lab, s in zip(labels, t.shape)])


def _like(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """zeros_like, rand_like, clone, a dropout: the first input's labels."""
    v = d.value(args[0])
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.set(t, v.labels if t.shape == args[0].shape else [(d.atoms.new(s),) if s > 1 else () for s in t.shape],
                  v.reduced)


def _factory(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """A tensor made in forward from sizes (zeros(B, T), arange(T)): its dims may line up with anything."""
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.fresh(t)


def _arange(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """arange(n), from 0 by 1: indexing a dim of size n with it keeps every row in place."""
    d.fresh(out)
    numbers = [a for a in args if isinstance(a, int | float)]
    if out.dim() == 1 and out.shape[0] > 1 and (len(numbers) == 1 or numbers[:1] == [0] and numbers[2:] in ([], [1])):
        d.atoms.iota.add(d.value(out).labels[0][0])


def _constant(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """torch.tensor([...]) and its kin: fixed values, fixed dims."""
    if isinstance(out, torch.Tensor):
        d.set(out, [(d.atoms.new(s, fixed=True),) if s > 1 else () for s in out.shape])


def _reshape(d: _Discovery, src: Sequence[Label], src_shape: Sequence[int], shape: Sequence[int]) -> list[Label]:
    """A view's output labels: the input's atoms regrouped, an atom split where a dim cuts through it."""
    queue = [a for label in src for a in d.expand(label)]
    labels: list[Label] = []
    for size in shape:
        if size == 1:
            labels.append(())
            continue
        taken: list[int] = []
        product = 1
        while product < size and queue:
            a = queue.pop(0)
            taken.append(a)
            product *= d.atoms.size[a]
        if product == size:
            labels.append(d.whole(tuple(taken)))
            continue
        if taken and product > size and (size * d.atoms.size[taken[-1]]) % product == 0:
            a = taken[-1]
            inner = size * d.atoms.size[a] // product  # how much of atom a this dim holds
            rest = d.atoms.size[a] // inner
            pieces = (d.atoms.new(inner, origin=a), d.atoms.new(rest, origin=a))
            d.atoms.children[a] = pieces
            d.atoms.couple(a, f"a reshape cuts through it at {d.where()}")
            labels.append(d.whole((*taken[:-1], pieces[0])))
            queue.insert(0, pieces[1])
            continue
        for a in [*taken, *queue]:
            d.atoms.couple(a, f"a reshape mixes it at {d.where()}")
        queue = []
        labels.append((d.atoms.new(size),))
    return [lab if len(lab) != 1 or d.atoms.size[lab[0]] > 1 else lab for lab in labels]


def _view(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    if not isinstance(out, torch.Tensor):
        return _unknown_rule(d, func, args, kwargs, out)
    v = d.value(x)
    d.set(out, _reshape(d, v.labels, x.shape, out.shape), v.reduced)


def _view_as_complex(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    v = d.value(args[0])
    d.set(out, v.labels[:-1], v.reduced)


def _view_as_real(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    v = d.value(args[0])
    d.set(out, [*v.labels, (d.atoms.new(2),)], v.reduced)


def _permute(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    n = x.dim()
    name = func.overloadpacket.__name__
    if name == "permute":
        order = [p % n for p in args[1]]
    elif name in ("t", "numpy_T") or n < 2:
        order = list(reversed(range(n)))
    else:  # transpose, swapaxes
        i, j = args[1] % n, args[2] % n
        order = list(range(n))
        order[i], order[j] = order[j], order[i]
    d.set(out, [v.labels[p] for p in order], v.reduced)


def _expand(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    lead = out.dim() - x.dim()
    labels = [(d.atoms.new(s),) if s > 1 else () for s in out.shape[:lead]]
    for k in range(x.dim()):
        labels.append(v.labels[k] if x.shape[k] == out.shape[lead + k] else (d.atoms.new(out.shape[lead + k]),))
    d.set(out, labels, v.reduced)


def _slice(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = _arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    labels = list(v.labels)
    if out.shape[dim] != x.shape[dim]:
        labels[dim] = _cut_piece(d, v.labels[dim], out.shape[dim], "sliced")
    d.set(out, labels, v.reduced)


def _cut_piece(d: _Discovery, label: Label, size: int, how: str) -> Label:
    """A part of a dim (a slice, a split, a narrow): a new atom, fixed if the dim was a weight's;
    the dim itself is coupled (its pieces are not the micro-batches' pieces)."""
    fixed = any(d.atoms.fixed[d.atoms.find(a)] for a in label)
    d.couple_label(label, f"{how} at {d.where()}")
    return (d.atoms.new(size, fixed=fixed),) if size > 1 else ()


def _select(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = _arg(func, args, kwargs, "dim", 0) % x.dim()
    d.couple_label(v.labels[dim], f"one index of it taken at {d.where()}")
    d.set(out, [lab for k, lab in enumerate(v.labels) if k != dim], v.reduced)


def _split(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    dim = _arg(func, args, kwargs, "dim", 0) % x.dim()
    name = func.overloadpacket.__name__
    for t in out:
        labels = list(v.labels)
        if name == "unbind":
            labels.pop(dim)
            d.couple_label(v.labels[dim], f"unbound at {d.where()}")
        elif t.shape[dim] != x.shape[dim]:
            labels[dim] = _cut_piece(d, v.labels[dim], t.shape[dim], "split")
        d.set(t, labels, v.reduced)


def _cat(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = [t for t in args[0] if t.dim() == out.dim()]
    dim = _arg(func, args, kwargs, "dim", 0) % out.dim()
    labels: list[Label] = []
    for k in range(out.dim()):
        if k == dim:
            for t in tensors:
                d.couple_label(d.value(t).labels[k], f"concatenated along it at {d.where()}")
            fixed = any(d.atoms.fixed[d.atoms.find(a)] for t in tensors for a in d.value(t).labels[k])
            labels.append((d.atoms.new(out.shape[k], fixed=fixed),) if out.shape[k] > 1 else ())
            continue
        shared: Label = ()
        for t in tensors:
            shared = d.unify(shared, d.value(t).labels[k]) if shared else d.value(t).labels[k]
        labels.append(shared)
    d.set(out, labels, d.reduced_in(args, kwargs))


def _stack(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    tensors = list(args[0])
    dim = _arg(func, args, kwargs, "dim", 0) % out.dim()
    rest = [lab for k, lab in enumerate(_broadcast_same(d, tensors))]
    rest.insert(dim, (d.atoms.new(out.shape[dim]),) if out.shape[dim] > 1 else ())
    d.set(out, rest, d.reduced_in(args, kwargs))


def _broadcast_same(d: _Discovery, tensors: Sequence[torch.Tensor]) -> list[Label]:
    labels = list(d.value(tensors[0]).labels)
    for t in tensors[1:]:
        labels = [d.unify(a, b) for a, b in zip(labels, d.value(t).labels)]
    return labels


def _couple_dims(dims_arg: str, default: Any = -1) -> Rule:
    """softmax, cumsum, sort, flip...: the output is shaped as the input; `dims_arg` dims are mixed."""

    def rule(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        mixed = _dims(_arg(func, args, kwargs, dims_arg, default), x.dim())
        for k in mixed:  # sorting rows (by expert) permutes them for indexing back: routing
            routed = name in ("sort", "argsort")
            d.couple_label(v.labels[k], f"{'sorted' if routed else name} along it at {d.where()}", routed=routed)
        _keep_others(d, x, v, mixed, out)

    return rule


def _last(n: int) -> Rule:
    def rule(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        mixed = list(range(max(x.dim() - n, 0), x.dim()))
        for k in mixed:
            d.couple_label(v.labels[k], f"{name} along it at {d.where()}")
        _keep_others(d, x, v, mixed, out)

    return rule


def _keep_others(d: _Discovery, x: torch.Tensor, v: _Value, mixed: list[int], out: Any) -> None:
    """Outputs of an op that mixes `mixed` dims (topk's values, a diagonal): the other dims keep
    their labels where the output lines up with the input, the mixed ones are new."""
    for t in pytree.tree_leaves(out):
        if not isinstance(t, torch.Tensor):
            continue
        if t.dim() == x.dim():
            d.set(t, [v.labels[k] if k not in mixed and s == x.shape[k] else (d.atoms.new(s),) if s > 1 else ()
                      for k, s in enumerate(t.shape)], v.reduced)
        elif t.dim() < x.dim():  # trailing mixed dims dropped (a diagonal, trace)
            d.set(t, [v.labels[k] if s == x.shape[k] and k not in mixed else (d.atoms.new(s),) if s > 1 else ()
                      for k, s in enumerate(t.shape)], v.reduced)
        else:
            d.fresh(t, v.reduced)


def _reduce(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return _unknown_rule(d, func, args, kwargs, out)
    v = d.value(x)
    dims = _dims(_arg(func, args, kwargs, "dim", None) or None, x.dim())
    keep = _arg(func, args, kwargs, "keepdim", False)
    removed = [a for k in dims for a in v.labels[k]]
    kept = [lab for k, lab in enumerate(v.labels) if k not in dims]
    full = not any(kept)
    name = func.overloadpacket.__name__
    if not full:
        for a in removed:
            d.atoms.couple(a, f"{name} over it at {d.where()}")
    labels = [() if k in dims else lab for k, lab in enumerate(v.labels)] if keep else kept
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            d.set(t, labels if t.dim() == len(labels) else [(d.atoms.new(s),) if s > 1 else () for s in t.shape],
                  v.reduced | (frozenset(removed) if full else frozenset()))


def _loss(target_index: int) -> Rule:
    """mse_loss, l1_loss, binary_cross_entropy...(self, target, ..., reduction): pointwise, then reduced."""

    def rule(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x, target = args[0], args[target_index]
        labels = _broadcast(d, [x, target], torch.empty(torch.broadcast_shapes(x.shape, target.shape), device="meta"))
        _reduced_loss(d, func, args, kwargs, out, labels)

    return rule


def _reduced_loss(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any, labels: list[Label]) -> None:
    reduction = _arg(func, args, kwargs, "reduction", 1)
    first = out[0] if isinstance(out, tuple | list) else out
    if reduction == 0:
        d.set(first, labels, d.reduced_in(args, kwargs))
    else:
        d.set(first, [], d.reduced_in(args, kwargs) | frozenset(a for lab in labels for a in lab))
    if isinstance(out, tuple | list):
        for t in out[1:]:
            d.fresh(t)


def _nll(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """nll_loss(self [N, C, d...] or [C], target [N, d...]): classes coupled, the rest lined up."""
    x, target = args[0], args[1]
    xv, tv = d.value(x), d.value(target)
    class_dim = 1 if x.dim() > 1 else 0
    d.couple_label(xv.labels[class_dim], f"{func.overloadpacket.__name__} over its classes at {d.where()}")
    rest = [lab for k, lab in enumerate(xv.labels) if k != class_dim]
    labels = [d.unify(a, b) for a, b in zip(rest, tv.labels)]
    _reduced_loss(d, func, args, kwargs, out, labels)


def _matmul_like(d: _Discovery, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> list[Label]:
    """a [..., n, k] @ b [..., k, m]: batch dims broadcast, k contracted (coupled)."""
    av, bv = d.value(a), d.value(b)
    a_labels = list(av.labels) if a.dim() > 1 else [(), *av.labels]
    b_labels = list(bv.labels) if b.dim() > 1 else [*bv.labels, ()]
    k = d.unify(a_labels[-1], b_labels[-2])
    d.couple_label(k, f"a matmul contracts it at {d.where()}")
    batch_out = out.dim() - (a.dim() > 1) - (b.dim() > 1)
    labels: list[Label] = []
    for pos in range(batch_out):
        shared: Label = ()
        for lab, shape in ((a_labels[:-2], a.shape[:-2]), (b_labels[:-2], b.shape[:-2])):
            j = pos - (batch_out - len(shape))
            if 0 <= j < len(shape) and shape[j] > 1:
                shared = d.unify(shared, lab[j]) if shared else lab[j]
        labels.append(shared)
    if a.dim() > 1:
        labels.append(a_labels[-2])
    if b.dim() > 1:
        labels.append(b_labels[-1])
    return labels


def _mm(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    name = func.overloadpacket.__name__
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm", "addmv") else (args[0], args[1])
    labels = _matmul_like(d, a, b, out)
    if name in ("addmm", "baddbmm", "addmv"):
        bias = args[0]
        for k in range(bias.dim()):
            pos = out.dim() - bias.dim() + k
            if bias.shape[k] == out.shape[pos] and bias.shape[k] > 1:
                labels[pos] = d.unify(labels[pos], d.value(bias).labels[k])
    d.set(out, labels, d.reduced_in(args, kwargs))


def _attention(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """sdpa(q [..., L, E], k [..., S, E], v [..., S, Ev], mask [..., L, S]): S and E coupled."""
    q, k, v = args[0], args[1], args[2]
    qv, kv, vv = d.value(q), d.value(k), d.value(v)
    e = d.unify(qv.labels[-1], kv.labels[-1])
    d.couple_label(e, f"attention contracts it at {d.where()}")
    s = d.unify(kv.labels[-2], vv.labels[-2])
    d.couple_label(s, f"attention mixes it at {d.where()}")
    lead: list[Label] = []
    n = max(q.dim(), k.dim(), v.dim()) - 2
    for pos in range(n):
        shared: Label = ()
        for t in (q, k, v):
            j = pos - (n - (t.dim() - 2))
            if 0 <= j < t.dim() - 2 and t.shape[j] > 1:
                shared = d.unify(shared, d.value(t).labels[j]) if shared else d.value(t).labels[j]
        lead.append(shared)
    mask = _arg(func, args, kwargs, "attn_mask", None)
    if isinstance(mask, torch.Tensor):
        full = [*lead, qv.labels[-2], s]
        mv = d.value(mask)
        for j in range(mask.dim()):
            pos = len(full) - mask.dim() + j
            if mask.shape[j] > 1:
                full[pos] = d.unify(full[pos], mv.labels[j])
    first = out[0] if isinstance(out, tuple | list) else out
    d.set(first, [*lead, qv.labels[-2], vv.labels[-1]], d.reduced_in(args, kwargs))
    if isinstance(out, tuple | list):
        for t in out[1:]:
            if isinstance(t, torch.Tensor):
                d.fresh(t)


def _embedding(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    weight, indices = args[0], args[1]
    d.set(out, [*d.value(indices).labels, d.value(weight).labels[-1]], d.reduced_in(args, kwargs))


def _gather(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """gather / index_select / take_along_dim (x, dim, index): the index's rows, x's dim mixed."""
    x = args[0]
    dim = _arg(func, args, kwargs, "dim", 0) % max(x.dim(), 1)
    index = _arg(func, args, kwargs, "index", None)
    xv = d.value(x)
    d.couple_label(xv.labels[dim], f"{func.overloadpacket.__name__} along it at {d.where()}", routed=True)
    iv = d.value(index)
    if func.overloadpacket.__name__ == "index_select":
        labels = list(xv.labels)
        labels[dim] = iv.labels[0] if iv.labels else ()
    else:
        labels = list(iv.labels)
        for k in range(min(x.dim(), index.dim())):
            if k != dim and x.shape[k] == index.shape[k] and x.shape[k] > 1:
                labels[k] = d.unify(labels[k], xv.labels[k])
    d.set(out, labels, d.reduced_in(args, kwargs))


def _index(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """x[idx] with tensor indices: indexed dims mixed, the indices' dims in their place."""
    x, indices = args[0], args[1]
    xv = d.value(x)
    used = [k for k, i in enumerate(indices) if i is not None]
    for k in used:
        i = indices[k]
        along = [lab for lab, s in zip(d.value(i).labels, i.shape) if s > 1]
        if len(along) == 1 and len(along[0]) == 1 and along[0][0] in d.atoms.iota and i.shape.numel() == x.shape[k]:
            d.unify(xv.labels[k], along[0])  # x[arange(B)[:, None], ...]: each row its own
        else:
            d.couple_label(xv.labels[k], f"indexed by a tensor at {d.where()}", routed=True)
    idx = [i for i in indices if i is not None]
    shape = torch.broadcast_shapes(*(i.shape for i in idx))
    idx_labels = _broadcast(d, idx, torch.empty(shape, device="meta"))
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest_before = [xv.labels[k] for k in range(used[0])] if adjacent else []
    rest_after = [xv.labels[k] for k in range(x.dim()) if k not in used and (not adjacent or k > used[-1])]
    labels = [*rest_before, *idx_labels, *rest_after]
    if len(labels) != out.dim():
        return d.unknown(func, args, out, "")
    d.set(out, labels, d.reduced_in(args, kwargs))


def _norm_last(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """layer_norm / rms_norm (x, normalized_shape, weight, ...): the normalized dims mixed."""
    x = args[0]
    n = len(args[1])
    v = d.value(x)
    for k in range(x.dim() - n, x.dim()):
        d.couple_label(v.labels[k], f"normalized at {d.where()}")
    weight = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    if weight is not None:
        for j in range(weight.dim()):
            d.unify(v.labels[x.dim() - weight.dim() + j], d.value(weight).labels[j])
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.set(t, [*v.labels[: x.dim() - n], *([()] * (t.dim() - (x.dim() - n)))], v.reduced)


def _batch_norm(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """Training BatchNorm: statistics over the batch and spatial dims (the batch: named, not refused)."""
    x = args[0]
    v = d.value(x)
    name = func.overloadpacket.__name__
    training = name != "_native_batch_norm_legit_no_training" and bool(
        _arg(func, args, kwargs, "training", True))
    for k in range(2, x.dim()):
        d.couple_label(v.labels[k], f"BatchNorm statistics at {d.where()}")
    weight = args[1] if isinstance(args[1], torch.Tensor) else None
    if weight is not None and x.dim() > 1:
        d.unify(v.labels[1], d.value(weight).labels[0])
    if training:
        d.batch_norms.append(d.where())
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.fresh(t)


def _group_norm(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    x = args[0]
    v = d.value(x)
    for k in range(1, x.dim()):
        d.couple_label(v.labels[k], f"GroupNorm at {d.where()}")
    outs = out if isinstance(out, tuple | list) else (out,)
    d.set(outs[0], v.labels, v.reduced)
    for t in outs[1:]:
        if isinstance(t, torch.Tensor):
            d.set(t, [v.labels[0], *([()] * (t.dim() - 1))], v.reduced)


def _channels_first(what: str) -> Rule:
    """conv, pooling, interpolation, padding: [N, C, *spatial]: N kept; C kept by pooling, mixed by conv."""

    def rule(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        x = args[0]
        v = d.value(x)
        name = func.overloadpacket.__name__
        conv = what == "conv"
        for k in range(1 if conv else 2, x.dim()):
            if conv or x.shape[k] > 1:
                d.couple_label(v.labels[k], f"{name} over it at {d.where()}")
        for t in (out if isinstance(out, tuple | list) else (out,)):
            if not isinstance(t, torch.Tensor):
                continue
            labels: list[Label] = []
            for k, s in enumerate(t.shape):
                if k == 0 and x.dim() == t.dim():
                    labels.append(v.labels[0])
                elif k == 1 and conv and isinstance(args[1], torch.Tensor):
                    labels.append(d.value(args[1]).labels[0] if s > 1 else ())
                elif k < x.dim() and x.shape[k] == s and (k == 1 or not conv):
                    labels.append(v.labels[k])
                else:
                    labels.append((d.atoms.new(s),) if s > 1 else ())
            d.set(t, labels, v.reduced)

    return rule


def _unknown_rule(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    d.unknown(func, args, out, "")


def _no_tensor(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """Ops that only read metadata or return nothing new."""


def _copy(d: _Discovery, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """copy_(dst, src): dst keeps its dims, lined up with src's by broadcasting."""
    dst, src = args[0], args[1]
    labels = _broadcast(d, [dst, src], dst)
    d.set(dst, labels, d.value(dst).reduced | d.value(src).reduced)
    if isinstance(out, torch.Tensor):
        d.set(out, labels)


_RULES: dict[str, Rule] = {}
for _rule, _names in (
    (_like, ("clone", "_to_copy", "detach", "alias", "lift_fresh_copy", "contiguous", "native_dropout", "dropout",
             "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
             "bernoulli", "_conj", "conj", "resolve_conj", "resolve_neg", "fill", "zero", "uniform", "normal",
             "exponential", "_conj_physical", "conj_physical", "real", "imag", "angle", "abs")),
    (_arange, ("arange",)),
    (_factory, ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "linspace",
                "empty_strided", "new_zeros", "new_ones", "new_empty", "new_full", "scalar_tensor", "eye", "tril_indices",
                "triu_indices", "new_empty_strided")),
    (_constant, ("lift_fresh", "_tensor_constant")),
    (_view, ("view", "_unsafe_view", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "flatten", "unflatten",
             "view_as", "reshape_as", "_reshape_copy", "view_copy")),
    (_view_as_complex, ("view_as_complex",)),
    (_view_as_real, ("view_as_real",)),
    (_permute, ("permute", "transpose", "t", "swapaxes", "swapdims", "numpy_T", "mT")),
    (_expand, ("expand", "expand_copy")),
    (_slice, ("slice", "narrow", "slice_copy")),
    (_select, ("select",)),
    (_split, ("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split",
              "unsafe_split_with_sizes")),
    (_cat, ("cat", "concat", "concatenate")),
    (_stack, ("stack",)),
    (_couple_dims("dim"), ("_softmax", "softmax", "_safe_softmax", "_log_softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp",
                           "cummax", "cummin", "sort", "argsort", "topk", "_softmax_backward_data", "kthvalue",
                           "median", "mode", "glu")),
    (_couple_dims("dims"), ("flip", "roll", "_fft_r2c", "_fft_c2r", "_fft_c2c")),
    (_couple_dims("repeats", None), ("repeat",)),
    (_last(2), ("tril", "triu", "diagonal", "diag_embed", "trace")),
    (_reduce, ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "std_mean",
               "logsumexp", "norm", "linalg_vector_norm", "prod", "all", "any", "count_nonzero", "nansum", "nanmean")),
    (_loss(1), ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div")),
    (_nll, ("nll_loss_forward", "nll_loss2d_forward", "nll_loss", "nll_loss_nd", "nll_loss2d")),
    (_mm, ("mm", "addmm", "bmm", "baddbmm", "matmul", "mv", "addmv", "dot")),
    (_attention, ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_fused_attention_overrideable")),
    (_embedding, ("embedding",)),
    (_gather, ("gather", "index_select", "take_along_dim")),
    (_index, ("index", "_unsafe_index")),
    (_norm_last, ("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm")),
    (_batch_norm, ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                   "_native_batch_norm_legit_no_training", "batch_norm", "_batch_norm_impl_index",
                   "cudnn_batch_norm", "_batch_norm_with_update", "_batch_norm_no_update")),
    (_group_norm, ("native_group_norm",)),
    (_channels_first("conv"), ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                               "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution")),
    (_channels_first("pool"), ("max_pool2d_with_indices", "max_pool1d", "max_pool2d", "max_pool3d_with_indices",
                               "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                               "_adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool3d",
                               "adaptive_max_pool2d", "adaptive_max_pool1d", "upsample_nearest1d",
                               "upsample_nearest2d", "upsample_bilinear2d", "upsample_linear1d", "upsample_bicubic2d",
                               "_upsample_nearest_exact2d", "constant_pad_nd", "reflection_pad1d",
                               "reflection_pad2d", "replication_pad1d", "replication_pad2d", "pixel_shuffle",
                               "pixel_unshuffle", "im2col", "col2im")),
    (_copy, ("copy", "copy_")),
    (_no_tensor, ("_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel", "_local_scalar_dense",
                  "_assert_async", "set_", "record_stream", "_assert_scalar", "item")),
):
    for _n in _names:
        _RULES[_n] = _rule
_RULES["masked_fill"] = _pointwise
_RULES["complex"] = _pointwise
_RULES["polar"] = _pointwise
_RULES["where"] = _pointwise
_RULES["clamp"] = _pointwise


# -- running it ---------------------------------------------------------------------------------


class _Runner(fx.Interpreter):
    """Runs the graph on meta, telling the discovery which node (and model line) it is in."""

    def __init__(self, gm: fx.GraphModule, discovery: _Discovery) -> None:
        super().__init__(gm)
        self.extra_traceback = False
        self.discovery = discovery
        self.node: fx.Node | None = None
        discovery.where = self.where

    def where(self) -> str:
        node = self.node
        if node is None:
            return _frame_source() or "the loss"
        source = info(node).source
        return str(source) if source is not None else f"node {node.name}"

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return super().call_module(target, args, kwargs)
        except RuntimeError as exc:
            if "on meta tensors" not in str(exc):
                raise
        # a torch module that reads values (nn.TransformerEncoder's causal-mask test): on CPU zeros,
        # as analysis/shapes.py runs it, each zero tensor labelled as the meta tensor it stands for
        d = self.discovery
        module = self.fetch_attr(str(target))

        def zeros(t: torch.Tensor) -> torch.Tensor:
            z = torch.zeros(t.shape, dtype=t.dtype)
            d.set(z, d.value(t).labels, d.value(t).reduced)
            return z

        state = {name: zeros(t) for name, t in (*module.named_parameters(), *module.named_buffers())}
        cpu_args, cpu_kwargs = pytree.tree_map_only(torch.Tensor, zeros, (args, kwargs))
        out = torch.func.functional_call(module, state, cpu_args, cpu_kwargs)

        def to_meta(t: torch.Tensor) -> torch.Tensor:
            m = torch.empty(t.shape, dtype=t.dtype, device="meta")
            d.set(m, d.value(t).labels, d.value(t).reduced)
            return m

        return pytree.tree_map_only(torch.Tensor, to_meta, out)

    def run_node(self, n: fx.Node) -> Any:
        self.node = n
        try:
            return super().run_node(n)
        finally:
            self.node = None


def _frame_source() -> str | None:
    from ..ir.trace import _internal

    frame = sys._getframe(2)
    while frame is not None:
        if not _internal(frame.f_code.co_filename):
            return str(SourceLine(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return None


def discover(
    gm: fx.GraphModule,
    input_names: Sequence[str],
    inputs: Sequence[Any],
    output_leaves: Callable[[Any], list[Any]],
    loss: Callable[[Any, Any], Any] | None = None,
    target: Any = None,
    declared: dict[str, int | None] | None = None,
) -> Decision:
    """Label every input dim, run `gm` (on meta copies) and the loss under the dispatch mode, and
    decide. `output_leaves(raw)`: the graph output's tensor leaves in the user's output order;
    `loss(raw_output, target)`: the loss on them (None: outputs only)."""
    from .shapes import _all_meta, meta_copy

    on_meta = gm if _all_meta(gm) else meta_copy(gm, {}, 1)
    d = _Discovery()
    meta_inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs]
    meta_target = pytree.tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, target)
    input_atoms: dict[str, tuple[int, ...]] = {}
    unread: dict[str, torch.Tensor] = {}
    target_atoms: list[tuple[int, ...] | None] = []
    runner = _Runner(on_meta, d)
    with torch.enable_grad(), d:
        for name, t in zip(input_names, meta_inputs):
            if isinstance(t, torch.Tensor):
                input_atoms[name] = d.label_input(t)
        for t in pytree.tree_leaves(meta_target):
            target_atoms.append(d.label_input(t) if isinstance(t, torch.Tensor) else None)
        raw = runner.run(*meta_inputs)
        loss_failed = None
        unread = {n: t for n, t in zip(input_names, meta_inputs) if isinstance(t, torch.Tensor) and id(t) not in d.read}
        outputs = [t for t in output_leaves(raw)]
        if loss is not None:
            try:
                loss(raw, meta_target)
            except Exception as exc:  # noqa: BLE001 - a loss that reads values (.item()) or mixes devices
                loss_failed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                target_atoms = [None] * len(target_atoms)
    decision = _decide(d, input_names, input_atoms, target_atoms, outputs, unread, declared)
    if loss_failed is not None and decision.size:  # the target's dims unseen: each target's first dim of the batch's size
        leaves = pytree.tree_leaves(meta_target)
        decision.target = tuple(next((k for k, s in enumerate(t.shape) if s == decision.size), None)
                                if isinstance(t, torch.Tensor) else None for t in leaves)
        decision.unproven.append(f"the loss did not run on meta ({loss_failed}): the target cut along its dim of "
                                 "the batch's size")
    return decision


def _decide(d: _Discovery, names: Sequence[str], input_atoms: dict[str, tuple[int, ...]],
            target_atoms: list[tuple[int, ...] | None], outputs: list[Any], unread: dict[str, torch.Tensor],
            declared: dict[str, int | None] | None = None) -> Decision:
    atoms = d.atoms
    # candidate classes: an input's dim no op couples and no weight fixes
    votes: dict[int, list[tuple[int, int]]] = {}  # root -> (input index, dim)
    routed: set[int] = set()
    first_reason = ""
    for i, name in enumerate(names):
        for k, a in enumerate(input_atoms.get(name, ())):
            if a < 0:
                continue
            why = atoms.why_not(a)
            if why is None:
                votes.setdefault(atoms.find(a), []).append((i, k))
                if atoms.routed_by(a) is not None:
                    routed.add(atoms.find(a))
            elif not first_reason and k == 0:
                first_reason = f"dim 0 of {name!r}: {why}"
    def score(root: int) -> tuple[bool, int, int, int]:
        hits = votes[root]
        return (root not in routed, len({i for i, _ in hits}), -min(k for _, k in hits), -min(i for i, _ in hits))

    unproven = list(d.unproven)
    if not votes and declared is None:
        return Decision({n: None for n in names}, tuple(None for _ in target_atoms),
                        tuple(None for _ in outputs), 0, [], unproven,
                        first_reason or "no input has a dim of size 2 or more")
    batch = max(votes, key=score) if votes else -1
    if declared is not None:
        batch = _declared_class(d, names, input_atoms, declared)
        if batch < 0:
            return Decision({n: None for n in names}, tuple(None for _ in target_atoms),
                            tuple(None for _ in outputs), 0, [], unproven, "batch_dims() gives no batch dim")
    elif batch in routed:
        unproven.append(f"the batch dim is {atoms.routed_by(batch)}: taken to route each example and bring it "
                        "back, as a mixture of experts routes tokens")

    def dim_of(found: Sequence[int] | None) -> int | None:
        if not found:
            return None
        dims = [k for k, a in enumerate(found) if a >= 0 and atoms.find(a) == batch]
        return dims[0] if len(dims) == 1 else None

    inputs = {n: dim_of(input_atoms.get(n)) for n in names}
    if declared is not None:
        inputs.update(declared)
        unread = {}
    for n, t in unread.items():  # only its sizes are read (zeros(x.shape[0], ...)): the batch's size marks it
        k = next((k for k, s in enumerate(t.shape) if s == atoms.size[batch]), None)
        inputs[n] = k
        if k is not None:
            unproven.append(f"{n!r}: only its sizes are read; cut along dim {k}, the batch's size")
    out_dims: list[int | None] = []
    for t in outputs:
        if not isinstance(t, torch.Tensor):
            out_dims.append(None)
            continue
        labels = d.value(t).labels
        dims = [k for k, lab in enumerate(labels) if lab and atoms.find(lab[0]) == batch]
        out_dims.append(dims[0] if dims else None)
    coupling = [f"BatchNorm at {', '.join(dict.fromkeys(d.batch_norms))} takes statistics over the batch"] \
        if d.batch_norms else []
    return Decision(inputs, tuple(dim_of(t) for t in target_atoms),
                    tuple(out_dims), atoms.size[batch], coupling, unproven)


def _declared_class(d: _Discovery, names: Sequence[str], input_atoms: dict[str, tuple[int, ...]],
                    declared: dict[str, int | None]) -> int:
    """The class of the dims a model file's batch_dims() names, or one line on why it cannot be cut."""
    unknown = sorted(set(declared) - set(names))
    if unknown:
        raise GraphsplitError(f"batch_dims() names {', '.join(map(repr, unknown))}, which the model takes no tensor "
                              f"as; its tensor inputs are {', '.join(map(repr, names))}")
    batch = -1
    for name, k in declared.items():
        if k is None:
            continue
        found = input_atoms.get(name, ())
        if not -len(found) <= k < len(found) or found[k] < 0:
            raise GraphsplitError(f"batch_dims() cuts {name!r} along dim {k}, which it does not have or has of size 1; "
                                  "give the dim that holds the examples")
        why = d.atoms.why_not(found[k])
        if why is not None:
            raise GraphsplitError(f"batch_dims() cuts {name!r} along dim {k}, but the model does not keep the examples "
                                  f"of that dim apart: {why}; give the dim that holds the examples")
        batch = d.atoms.find(found[k]) if batch < 0 else batch
    return batch


def find_batch_dims(
    gm: fx.GraphModule,
    input_names: Sequence[str],
    flat: Sequence[Any],
    output_leaves: Callable[[Any], list[Any]],
    loss: Callable[[Any, Any], Any] | None = None,
    target: Any = None,
    declared: dict[str, int | None] | None = None,
) -> BatchDims:
    """`discover`, as the program's BatchDims. Where the graph does not run on meta (the analysis
    then names what fails) or an input is empty, dim 0 of each, as before discovery."""
    if any(isinstance(t, torch.Tensor) and t.numel() == 0 for t in flat):
        return BatchDims.leading(input_names, flat)
    try:
        found = discover(gm, input_names, flat, output_leaves, loss, target, declared)
    except GraphsplitError:
        raise
    except Exception:  # noqa: BLE001 - the analysis runs the graph next and says what fails, and where
        return BatchDims.leading(input_names, flat)
    notes = [f"assumed: {u}" for u in found.unproven]
    if not found.size:
        notes.append(f"no batch: {found.why_none}")
    return BatchDims(dict(found.inputs), found.target, found.outputs, found.size,
                     "batch_dims()" if declared is not None else "found", tuple(notes))
