"""Runs of identical repeated blocks in a traced graph (a transformer's layers): found once, for every
analysis that does one block's work for all of them (the planner's fold, batch discovery).

Only exact repeats count: every block after the first must have the same ops, on the same relative
arguments, as the second (checked op by op); anything else is left whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from torch.utils._pytree import tree_flatten

from .meta import block_of, module_path

MIN_BLOCKS = 4  # fewer are cheaper to compile whole than to fold and check


@dataclass(frozen=True)
class Fold:
    """How the folded graph's op sequence maps onto the whole model's."""

    blocks: tuple[str, ...]  # the repeated blocks' module paths, in order ("layers.0", ... "layers.L-1")

    @property
    def count(self) -> int:
        return len(self.blocks)

    def block_name(self, path: str, copy: int) -> str:
        """`layers.1.attn.wq.weight` -> `layers.<copy>.attn.wq.weight` (names in the second block stand for
        the same names in every later block)."""
        second = self.blocks[1]
        if path == second or path.startswith(second + "."):
            return self.blocks[copy] + path[len(second):]
        return path


def _segments(ops: list[fx.Node]) -> list[tuple[str | None, list[fx.Node]]]:
    """Maximal runs of ops by the repeated block they lie in (None: outside every block)."""
    runs: list[tuple[str | None, list[fx.Node]]] = []
    for op in ops:
        block = block_of(module_path(op))
        if runs and runs[-1][0] == block:
            runs[-1][1].append(op)
        else:
            runs.append((block, [op]))
    return runs


def _container(block: str) -> str:
    return block.rpartition(".")[0]


def _signature(ops: list[fx.Node], block: str, previous: set[fx.Node], shared: set[fx.Node]) -> list[Any]:
    """What each op does, with arguments named relative to its block: an op of this block by position,
    an op of the previous block by position, a shared value by identity, a module or attribute by its
    path inside the block, with its kind and shapes (a block that is one module call, an nn.Sequential's
    children: a conv and a norm are not alike). Equal signatures mean the blocks compute alike."""
    index = {op: i for i, op in enumerate(ops)}
    prev_order: dict[fx.Node, int] = {}
    owner = ops[0].graph.owning_module if ops else None

    def rel(path: str) -> str:
        return path[len(block):] if path == block or path.startswith(block + ".") else "/" + path

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a in index:
                return ("own", index[a])
            if a in previous:
                return ("prev", prev_order.setdefault(a, len(prev_order)))
            if a.op == "get_attr":
                return ("attr", rel(str(a.target)), _attr_shape(owner, str(a.target)))
            if a in shared:
                return ("shared", a.name)
            return ("outside", a.name)
        if isinstance(a, (tuple, list)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(v)) for k, v in sorted(a.items())))
        if isinstance(a, slice):
            return ("slice", arg(a.start), arg(a.stop), arg(a.step))
        return ("const", repr(a))

    out = []
    for op in ops:
        target = (rel(str(op.target)), *_module_kind(owner, str(op.target))) if op.op == "call_module" else op.target
        out.append((op.op, target, tuple(arg(a) for a in op.args), tuple((k, arg(v)) for k, v in op.kwargs.items())))
    return out


def _module_kind(owner: Any, path: str) -> tuple[Any, ...]:
    """A called module's class, its settings (`extra_repr`: a conv's channels and kernel) and the shapes
    of its parameters and buffers."""
    if owner is None:
        return ()
    module = owner.get_submodule(path)
    shapes = tuple((name, tuple(t.shape)) for name, t in (*module.named_parameters(), *module.named_buffers()))
    return (type(module).__qualname__, module.extra_repr(), shapes)


def _attr_shape(owner: Any, path: str) -> Any:
    """The shape of the tensor a get_attr reads (None for anything else)."""
    if owner is None:
        return None
    value: Any = owner
    for part in path.split("."):
        value = getattr(value, part, None)
    return tuple(value.shape) if hasattr(value, "shape") else None


def _stands_in(leaf: list[fx.Node], previous: Any, second: tuple[Any, Any, fx.Node], first_out: fx.Node,
               in_head: set[fx.Node]) -> bool:
    """Whether `leaf` is one call of a block traced as a leaf (alike_blocks.py: alike the second block)
    called as the second block was: its stream argument the block before's output where the second
    block's was the first block's, every other argument the same head value or constant."""
    if len(leaf) != 1 or leaf[0].op != "call_module" or not isinstance(previous, fx.Node):
        return False
    args, kwargs, _ = second
    # the node's containers are fx's immutable ones: the call's, made alike
    want, spec = tree_flatten(fx.node.map_aggregate((args, kwargs), lambda a: a))
    got, got_spec = tree_flatten(fx.node.map_aggregate((leaf[0].args, leaf[0].kwargs), lambda a: a))
    if spec != got_spec:
        return False
    for w, g in zip(want, got):
        if w is first_out:
            if g is not previous:
                return False
        elif isinstance(w, fx.Node):
            if w is not g or w not in in_head:
                return False
        elif type(w) is not type(g) or w != g:
            return False
    return True


def _reads_only_its_call(ops: list[fx.Node], call: tuple[Any, Any, Any], in_head: set[fx.Node]) -> bool:
    """The second block's ops read nothing from outside it but its arguments and the head's values
    (what its stand-ins are checked against)."""
    args = {a for a in tree_flatten((call[0], call[1]))[0] if isinstance(a, fx.Node)}
    mine = set(ops)
    return all(a in mine or a in args or a in in_head for op in ops for a in op.all_input_nodes)


def find_fold(gm: fx.GraphModule, calls: dict[str, tuple[Any, Any, Any]] | None = None,
              alike: frozenset[str] = frozenset()
              ) -> tuple[Fold, list[fx.Node], list[fx.Node], list[list[fx.Node]], list[fx.Node]] | None:
    """The longest run of identical repeated blocks: (fold, head ops, tail ops, blocks' ops, all ops),
    or None when the model has no run of MIN_BLOCKS exact repeats. `alike`: blocks traced as one
    call each (alike_blocks.py), `calls`: how the first two blocks were called (Traced.calls)."""
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    runs = _segments(ops)
    best: tuple[int, int] | None = None  # (first run index, number of runs)
    i = 0
    while i < len(runs):
        block = runs[i][0]
        if block is None:
            i += 1
            continue
        j = i + 1
        while j < len(runs) and runs[j][0] is not None and _container(runs[j][0]) == _container(block) \
                and runs[j][0] not in {r[0] for r in runs[i:j]}:
            j += 1
        if j - i >= MIN_BLOCKS and (best is None or j - i > best[1]):
            best = (i, j - i)
        i = j
    if best is None:
        return None
    first, count = best
    blocks = [runs[first + k][1] for k in range(count)]
    names = tuple(str(runs[first + k][0]) for k in range(count))
    head = [op for r in runs[:first] for op in r[1]]
    tail = [op for r in runs[first + count:] for op in r[1]]
    in_head = set(head) | {n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")}
    # a few first blocks unlike the rest (DeepSeek-V3's 3 dense layers before 58 mixtures of experts)
    # join the head: the fold starts at the first block from which every block is alike its predecessor
    skip = 0 if alike else _first_alike(blocks, names, in_head)
    if skip is None:
        return None
    if skip:
        head += [op for b in blocks[:skip] for op in b]
        in_head |= {op for b in blocks[:skip] for op in b}
        blocks, names, count = blocks[skip:], names[skip:], count - skip
    reference = _signature(blocks[1], names[1], set(blocks[0]), in_head)
    calls = calls or {}
    second, first = calls.get(names[1]), calls.get(names[0])
    outputs = {names[0]: first[2] if first else None, names[1]: second[2] if second else None}
    # blocks traced as one call stand in only for a second block that returns one value and reads
    # nothing but its arguments and the head's values
    template = second is not None and isinstance(outputs[names[0]], fx.Node) \
        and isinstance(outputs[names[1]], fx.Node) and _reads_only_its_call(blocks[1], second, in_head)
    for k in range(2, count):
        if names[k] in alike:
            if not template or not _stands_in(blocks[k], outputs.get(names[k - 1]), second, outputs[names[0]], in_head):
                return None
            outputs[names[k]] = blocks[k][0]
        elif _signature(blocks[k], names[k], set(blocks[k - 1]), in_head) != reference:
            return None
    # the tail and the head may read only the last block (and never an earlier one)
    earlier = {op for b in blocks[:-1] for op in b}
    if any(a in earlier for op in tail for a in op.all_input_nodes):
        return None
    return Fold(names), head, tail, blocks, ops


def _first_alike(blocks: list[list[fx.Node]], names: tuple[str, ...], in_head: set[fx.Node]) -> int | None:
    """The first block s from which every block computes alike its predecessor (s + 1 standing for all
    later ones, s itself alike them, so the first and second folded blocks line up op by op), leaving
    MIN_BLOCKS blocks at least; None when there is none."""
    head = set(in_head)
    for s in range(len(blocks) - MIN_BLOCKS + 1):
        if s:
            head |= set(blocks[s - 1])
        reference = _signature(blocks[s + 1], names[s + 1], set(blocks[s]), head)
        if s and (len(blocks[s]) != len(blocks[s + 1])
                  or _signature(blocks[s], names[s], set(blocks[s - 1]), head - set(blocks[s - 1])) != reference):
            continue
        if all(_signature(blocks[k], names[k], set(blocks[k - 1]), head) == reference
               for k in range(s + 2, len(blocks))):
            return s
    return None
