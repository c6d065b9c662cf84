"""A dim cut into chunks and put back: litgpt's chunked cross-entropy and its kind.

    logits.reshape(-1, V).split(128)  ->  cross_entropy(chunk, ..., reduction="none") each
    ->  torch.cat(losses).sum() / count

Each chunk holds rows of several samples, and another batch size cuts them elsewhere: on its own a
chunk is no piece of the micro-batches. But where every chunk is only worked on row by row and the
chunks are then concatenated back in order (or each summed, the sums added), the result is the
whole dim's, however it was cut. So a split does not couple its dim at once: each chunk is an atom of
its own (`Atoms.piece_of`), and when the discovery is over, `settle` couples the dim only if its
chunks were not all put back (`rejoin`) or summed (`summed`), or if an op mixed the rows of a chunk
(a mean over one: its chunks' sizes would weigh it). The rules call these three.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .atoms import Chunks, Label

if TYPE_CHECKING:
    from .mode import Discovery


def cut(d: Discovery, label: Label, sizes: list[int], where: str) -> list[Label]:
    """A label per chunk of `label` cut into `sizes` (size-1 chunks: no dim), the cut recorded."""
    pieces = []
    for size in sizes:
        piece = d.atoms.new(size)
        d.atoms.piece_of[piece] = label
        pieces.append(piece)
    d.chunks.append(Chunks(label, tuple(pieces), where))
    return [(p,) if s > 1 else () for p, s in zip(pieces, sizes)]


def _group(d: Discovery, atom: int) -> Chunks | None:
    root = d.atoms.find(atom)
    return next((c for c in d.chunks if any(d.atoms.find(p) == root for p in c.pieces)), None)


def rejoin(d: Discovery, labels: list[Label]) -> Label | None:
    """The cut dim, where `labels` (a concatenation's, along its dim) are exactly its chunks in order."""
    if not d.chunks or not labels or any(len(lab) != 1 for lab in labels):
        return None
    roots = [d.atoms.find(lab[0]) for lab in labels]
    # every cut these are the chunks of (the logits' and the targets' chunks, lined up by the loss)
    groups = [c for c in d.chunks if [d.atoms.find(p) for p in c.pieces] == roots]
    for group in groups:
        group.rejoined = True
    return groups[0].label if groups else None


def summed(d: Discovery, atoms: list[int], how: str, adds: bool) -> None:
    """A full reduction over `atoms`: a sum (`adds`) of a chunk is a share of the whole dim's sum;
    anything else (a mean, a max) over a chunk weighs or picks by how the dim was cut."""
    for a in atoms:
        group = _group(d, a) if d.chunks else None
        if group is None:
            continue
        if adds:
            d.summed_pieces.add(a)  # (its class's root is looked up when all has run: unions come later)
        else:
            group.mixed.append(f"{how} over one chunk of it at {d.where()}")


def settle(d: Discovery) -> None:
    """Couple each cut dim whose chunks do not add up to it (see the module docstring); dims cut into
    chunks the ops lined up one by one (the logits' and the targets') are one dim."""
    by_roots: dict[tuple[int, ...], Chunks] = {}
    for group in d.chunks:
        first = by_roots.setdefault(tuple(d.atoms.find(p) for p in group.pieces), group)
        if first is not group:
            d.unify(first.label, group.label)
    summed_roots = {d.atoms.find(a) for a in d.summed_pieces}
    for group in d.chunks:
        roots = [d.atoms.find(p) for p in group.pieces]
        coupled = next((d.atoms.coupled[r] for r in roots if r in d.atoms.coupled), None)
        why = group.mixed[0] if group.mixed else coupled
        if why is None and not group.rejoined and not all(r in summed_roots for r in roots):
            why = f"split at {group.where}"
        if why is not None:
            d.couple_label(group.label, why)


def lineage(d: Discovery) -> Callable[[Label], Label]:
    """label -> its atoms, a chunk's standing for the dim it was cut from (that dim holds what it holds);
    for when all has run (the chunks' classes looked up once)."""
    cut_from = {d.atoms.find(p): group.label for group in d.chunks for p in group.pieces}

    def atoms_of(label: Label) -> Label:
        out: list[int] = []
        for a in d.expand(label):
            parent = cut_from.get(d.atoms.find(a))
            out.extend(atoms_of(parent) if parent is not None and parent != label else (a,))
        return tuple(out)
    return atoms_of
