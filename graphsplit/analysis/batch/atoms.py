"""Dim labels: atoms in classes (union-find), with what couples or fixes each class."""

from __future__ import annotations

from dataclasses import dataclass, field

Label = tuple[int, ...]  # one dim: the atoms it holds, outermost first; () for a size-1 dim


class Atoms:
    """Union-find over dim atoms with what is known of each class."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.fixed: list[bool] = []  # a weight's, a buffer's or a constant's dim
        self.origin: list[int | None] = []  # the atom it was split from
        self.children: dict[int, tuple[int, ...]] = {}
        self.coupled: dict[int, str] = {}  # atom -> why (first reason), resolved through find()
        # root -> every (graph node, why) that coupled it, in the order the ops ran: which nodes mix a
        # dim (context parallelism may cut the sequence only where attention alone mixes it)
        self.mixers: dict[int, list[tuple[str, str]]] = {}
        self.at = ""  # the graph node running now ("" in the loss)
        # mixed only by indexing with computed indices (a mixture of experts routes each token's row out
        # and back): per-row in every model seen, but not provable from shapes: the batch when no
        # other dim is, said as assumed
        self.routed: dict[int, str] = {}
        self.inputs: set[int] = set()  # atoms of the inputs' and target's dims
        # a dim made in forward (zeros(B * T, C), a repeat to B * heads) that lines up with merged
        # dims stands for them: root -> those atoms
        self.alias: dict[int, tuple[int, ...]] = {}
        self.iota: set[int] = set()  # atoms of an arange(n) from 0 by 1: indexing with it picks every row
        self.piece_of: dict[int, tuple[int, ...]] = {}  # an atom cut from a dim (a slice) -> that dim's label
        # root -> the dim a value was written into part of (circular padding copies x into a slice of a
        # bigger tensor the conv then mixes): x's dim is mixed where that dim is
        self.written_into: dict[int, tuple[int, ...]] = {}

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
            for reasons in (self.coupled, self.routed, self.written_into):
                if rb in reasons:
                    reasons.setdefault(ra, reasons.pop(rb))  # type: ignore[arg-type]
            if rb in self.mixers:
                self.mixers.setdefault(ra, []).extend(self.mixers.pop(rb))

    def couple(self, a: int, why: str, routed: bool = False) -> None:
        (self.routed if routed else self.coupled).setdefault(self.find(a), why)
        self.mixers.setdefault(self.find(a), []).append((self.at, why))

    def mixed_by(self, a: int) -> list[tuple[str, str]]:
        """Every (graph node, why) that coupled atom `a`'s class ("" as the node: the loss)."""
        return list(self.mixers.get(self.find(a), []))

    def routed_by(self, a: int) -> str | None:
        return self.routed.get(self.find(a))

    def loss_couples(self, a: int) -> str | None:
        """Why atom `a`'s class cannot be cut, when only the loss couples it (a contrastive loss over the
        batch x batch logits, in loss_fn), else None: the model keeps the examples apart up to its
        output, so the loss alone needs the whole batch."""
        seen = a
        while True:
            root = self.find(seen)
            if root in self.coupled:
                mixers = self.mixers.get(root, [])
                loss_only = bool(mixers) and all(node == "" for node, _ in mixers) and not self.fixed[root]
                return self.coupled[root] if loss_only and root not in self.routed else None
            if self.fixed[root]:
                return None
            origin = self.origin[seen]
            if origin is None:
                return None
            seen = origin

    def why_not(self, a: int, visited: frozenset[int] = frozenset()) -> str | None:
        """Why atom `a`'s class cannot be cut (None: it can)."""
        seen = a
        while True:
            root = self.find(seen)
            if root in self.coupled:
                return self.coupled[root]
            if self.fixed[root]:
                return "lines up with a weight's or buffer's dim"
            if root in self.written_into and root not in visited:
                for parent in self.written_into[root]:
                    why = self.why_not(parent, visited | {root})
                    if why is not None:
                        return f"written into part of a dim that is mixed ({why})"
            origin = self.origin[seen]
            if origin is None:
                return None
            seen = origin


@dataclass
class Chunks:
    """A dim cut into chunks (a split of the flattened tokens): coupled or not once all has run (chunks.py)."""

    label: Label  # the dim that was cut
    pieces: tuple[int, ...]  # an atom per chunk, in order
    where: str
    rejoined: bool = False
    mixed: list[str] = field(default_factory=list)  # why the rows of a chunk were mixed


@dataclass
class Value:
    labels: tuple[Label, ...]
    reduced: frozenset[int] = frozenset()  # atoms a full reduction summed over on the way here


