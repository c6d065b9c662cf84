"""The dispatch mode that relates the labels of each ATen op's inputs and outputs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .atoms import Atoms, Chunks, Label, Value


class Discovery(TorchDispatchMode):
    """Relates the labels of each ATen op's inputs and outputs (see the module's docstring)."""

    in_loss = False  # the loss's Python runs (decide.py sets it)

    def __init__(self, rules: Mapping[str, Callable[..., None]], pointwise: Callable[..., None]) -> None:
        """`rules`: op name -> its rule (rules.py's table); `pointwise`: the rule of ops ATen tags pointwise."""
        super().__init__()
        self.rules = rules
        self.pointwise = pointwise
        self.atoms = Atoms()
        self.values: dict[int, tuple[torch.Tensor, Value]] = {}  # id -> (tensor kept alive, value)
        self.where: Callable[[], str] = lambda: ""
        self.unproven: dict[str, None] = {}
        self.read: set[int] = set()  # ids of the tensors some op took
        self.bags: list[str] = []  # graph nodes of embedding_bag calls with one index per bag (layout.py)
        self.chunks: list[Chunks] = []  # dims cut into chunks, coupled or not when all has run (chunks.py)
        self.summed_pieces: set[int] = set()  # roots of chunks summed whole

    # -- labels of tensors ----------------------------------------------------------------------

    def label_input(self, t: torch.Tensor) -> tuple[int, ...]:
        atoms = tuple(self.atoms.new(s) if s > 1 else -1 for s in t.shape)
        self.atoms.inputs.update(a for a in atoms if a >= 0)
        self.values[id(t)] = (t, Value(tuple((a,) if a >= 0 else () for a in atoms)))
        return atoms

    def value(self, t: torch.Tensor) -> Value:
        held = self.values.get(id(t))
        if held is not None and held[0] is t:
            return held[1]
        # a tensor no op made here: a weight, a buffer, a constant: its dims are fixed. In the loss (its
        # Python, not the graph), one the loss keeps from an earlier call (open_clip's ClipLoss caches its
        # labels) is no weight: its dims are new
        v = Value(tuple((self.atoms.new(s, fixed=not self.in_loss),) if s > 1 else () for s in t.shape))
        self.values[id(t)] = (t, v)
        return v

    def set(self, t: Any, labels: Sequence[Label], reduced: frozenset[int] = frozenset()) -> None:
        if isinstance(t, torch.Tensor):
            self.values[id(t)] = (t, Value(tuple(labels), reduced))

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
        """One dim that may stand for merged dims: made in forward (`zeros(B * T, C)`), or an input's (a
        target that comes flattened to batch x length); not a weight's."""
        return len(label) == 1 and not self.atoms.fixed[self.atoms.find(label[0])]

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
        return tensors_of((args, kwargs))

    def reduced_in(self, args: Any, kwargs: Any, tensors: list[torch.Tensor] | None = None) -> frozenset[int]:
        found: frozenset[int] = frozenset()
        for t in self.tensors_in(args, kwargs) if tensors is None else tensors:
            found |= self.value(t).reduced
        return found

    def relate(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = func.overloadpacket.__name__ if isinstance(func, torch._ops.OpOverload) else str(func)
        bare = name.rstrip("_") if not name.startswith("_") else name
        tensors = self.tensors_in(args, kwargs)
        taint = self.reduced_in(args, kwargs, tensors)
        self.read.update(id(t) for t in tensors)
        rule = self.rules.get(bare) or self.rules.get(name)
        if rule is None and isinstance(func, torch._ops.OpOverload) and torch.Tag.pointwise in func.tags:
            rule = self.pointwise
        if rule is None:
            self.unknown(func, args, out, "")
        else:
            rule(self, func, args, kwargs, out)
        # a value summed over the batch meeting values that still hold it: samples are coupled
        if taint:
            for t in tensors_of(out):
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
        first = next(iter(tensors_of(args)), None)
        outs = tensors_of(out)
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


def tensors_of(tree: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or output, in order: tuples, lists and dicts walked by hand
    (an op's arguments are no deeper; pytree's general walk costs several times more a call, and the
    discovery makes one or more a dispatched op)."""
    found: list[torch.Tensor] = []
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found
