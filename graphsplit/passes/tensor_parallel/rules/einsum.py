"""torch.einsum by its equation's letters: a shard is a letter (the sharded dim's), which every operand
holding it must share and the output keeps where it names it (Time-Series-Library's and x-transformers'
attention, `einsum("blhe,bshe->bhls", q, k)` over sharded heads); summed over, it leaves partial sums,
added up right after (Megatron's g)."""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from ....ir.meta import info
from ....ir.op_kinds import OpKind
from ....ir.sharding import Partial, Shard
from ..decision import BROADCAST, Decision, LayoutView, Need, register, replicated
from ..layout import einsum_letters
from ..spellings import describe, einsum_operands


def einsum_shard(node: fx.Node, shapes: list[tuple[int, ...] | None],
                 layouts: list[Any]) -> tuple[str, list[str], str, tuple[int, ...] | None] | None:
    """(the sharded letter, each operand's letters, the output's, the shard's chunks) where every sharded
    operand is cut along one letter alike: plainly, or chunk by chunk (each rank's heads of a merged batch x
    heads dim, einops' `(b h) n d`) where the output keeps the letter; None otherwise."""
    found = einsum_operands(node)
    if found is None or any(s is None for s in shapes):
        return None
    eq, _ = found
    parsed = einsum_letters(eq, [len(s) for s in shapes])  # type: ignore[arg-type]
    if parsed is None:
        return None
    letters, out = parsed
    cut = {letters[i][lay.dim] for i, lay in enumerate(layouts) if isinstance(lay, Shard)}
    chunks = {lay.chunks for lay in layouts if isinstance(lay, Shard)}
    if len(cut) != 1 or len(chunks) != 1 or any(isinstance(lay, Shard) and lay.padded for lay in layouts):
        return None
    letter, kept = cut.pop(), chunks.pop()
    if kept and letter not in out:
        return None
    return letter, letters, out, kept


@register(OpKind.EINSUM)
def einsum(node: fx.Node, view: LayoutView) -> Decision:
    """The letter every sharded operand is cut along: kept in the output where it names it, each whole
    operand holding it cut alike (or read whole where it broadcasts it, size 1), one without it read
    whole; a letter summed over gives partial sums, every operand holding it cut alike."""
    found = einsum_operands(node)
    if found is None:
        return replicated(node, view, f"{describe(node)}: an einsum graphsplit cannot read")
    operands = found[1]
    tensors = [a for a in operands if isinstance(a, fx.Node) and info(a).value == "tensor"]
    if len(tensors) != len(operands):
        return replicated(node, view, f"{describe(node)}: an einsum graphsplit cannot read")
    if not view.sharded_inputs(node):
        return Decision(view.whole(node))
    if any(view.layout(a).is_partial() for a in tensors):
        return replicated(node, view, f"{describe(node)} of a partial sum")
    shapes = [view.shape(a) for a in tensors]
    layouts = [view.layout(a) for a in tensors]
    cut = einsum_shard(node, shapes, layouts)
    if cut is None:
        return replicated(node, view, f"{describe(node)} with operands cut along different letters")
    letter, letters, out, chunks = cut
    needs: list[tuple[fx.Node, Need]] = []
    for a, lay, term, shape in zip(tensors, layouts, letters, shapes):
        if isinstance(lay, Shard):
            continue
        d = term.find(letter)
        # a factor of every term along the letter (without it, or broadcasting it) is read whole
        needs.append((a, BROADCAST if d < 0 or shape[d] == 1 else Shard(d, chunks)))  # type: ignore[index]
    if letter in out:
        return Decision(Shard(out.index(letter), chunks), inputs=tuple(needs))
    return Decision(Partial(), inputs=tuple(needs))
