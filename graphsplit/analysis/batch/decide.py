"""Running the graph and the loss under the mode, and deciding where the batch is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ...errors import GraphsplitError
from ...ir.batch import BatchDims, SequenceDims
from ...ir.devices import on_meta
from ...ir.module_state import left_as_found
from ...ir.op_kinds import OpKind, classify
from .chunks import lineage, settle
from .mode import Discovery
from .rules import RULES, pointwise
from .runner import GraphRunner, discovering
from .sums import batch_sums
from .tail import WholeTail, whole_tail


@dataclass
class Decision:
    """What discovery found: per input name, per target leaf and per output leaf the batch dim
    (None: no batch there), the batch size, and why other dims were not the batch."""

    inputs: dict[str, int | None]
    target: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    size: int  # the example's batch size (0: no batch)
    unproven: list[str] = field(default_factory=list)  # ops assumed to keep samples apart
    why_none: str = ""  # with no batch: why dim 0 of the first input is not one
    # per input name, per dim: every (graph node, why) that mixes it ("" as the node: the loss), and
    # whether it lines up with a weight's or buffer's dim (a position table): where a sequence may be cut
    mixers: dict[str, tuple[tuple[tuple[tuple[str, str], ...], bool], ...]] = field(default_factory=dict)
    sequence: SequenceDims | None = None  # the dims attention calls mix (`_sequence`)
    # the loss alone, or the model's tail, couples the batch (a contrastive loss): why, and where; "" when
    # it does not
    whole_loss: str = ""
    # the model's own tail pairs or couples the samples (tail.py): (node, batch dim, its readers there) of
    # each value gathered over the replicas before it
    gather: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    # embedding_bag calls whose indices and offsets are cut with the batch, one index per bag
    bags: tuple[str, ...] = ()
    sums: tuple[str, ...] = ()  # nodes that sum the batch away, unnormalized (sums.py)


class ModelDidNotRun(Exception):
    """The graph failed on meta under discovery (a shape the model rejects): not graphsplit's error."""


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
    from ..shapes import _all_meta, meta_copy

    runnable = gm if _all_meta(gm) else meta_copy(gm, {}, 1)
    d = Discovery(RULES, pointwise)
    meta_inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs]
    meta_target = pytree.tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, target)
    input_atoms: dict[str, tuple[int, ...]] = {}
    unread: dict[str, torch.Tensor] = {}
    target_atoms: list[tuple[int, ...] | None] = []
    runner = GraphRunner(runnable, d)
    with discovering(d), left_as_found(runnable):
        for name, t in zip(input_names, meta_inputs):
            if isinstance(t, torch.Tensor):
                input_atoms[name] = d.label_input(t)
        for t in pytree.tree_leaves(meta_target):
            target_atoms.append(d.label_input(t) if isinstance(t, torch.Tensor) else None)
        try:
            raw = runner.run(*meta_inputs)
        except GraphsplitError:
            raise
        except Exception as exc:  # the model's own failure on meta: the analysis names it next
            raise ModelDidNotRun(str(exc)) from exc
        if runner.skipper is not None:  # the skipped blocks' nodes mix what their twins in block 2 mix
            for found in d.atoms.mixers.values():
                found.extend([(twin, why) for node, why in list(found) for twin in runner.skipper.same_place(node)])
        loss_failed = None
        unread = {n: t for n, t in zip(input_names, meta_inputs) if isinstance(t, torch.Tensor) and id(t) not in d.read}
        outputs = [t for t in output_leaves(raw)]
        if loss is not None:
            try:
                d.in_loss = True
                with on_meta():  # the loss's own factory calls (a contrastive loss's labels) on meta too
                    loss(raw, meta_target)
            except Exception as exc:  # noqa: BLE001 - a loss that reads values (.item()) or mixes devices
                loss_failed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                target_atoms = [None] * len(target_atoms)
    settle(d)  # a dim cut into chunks: coupled unless they add up to it again
    skipped = frozenset(n.name for n in runner.skipper.skipped) if runner.skipper is not None else frozenset()

    def tail_of(roots: frozenset[int]) -> WholeTail | None:
        return whole_tail(gm, d.atoms, runner.labels, roots, skipped)

    output_nodes = [runner.made_by.get(id(t)) if isinstance(t, torch.Tensor) else None for t in outputs]
    decision = _decide(d, input_names, input_atoms, target_atoms, outputs, unread, declared, tail_of, output_nodes)
    decision.mixers = {name: tuple((tuple(d.atoms.mixed_by(a)), d.atoms.fixed[d.atoms.find(a)]) if a >= 0 else ((), False)
                                   for a in found) for name, found in input_atoms.items()}
    if decision.size:
        skipped = [name for bag in d.bags for name in runner.skipper.same_place(bag)] if runner.skipper else []
        decision.bags = tuple(dict.fromkeys([*d.bags, *skipped]))
    decision.sequence = _sequence(d, gm, input_names, input_atoms, target_atoms, outputs, decision)
    if decision.size:  # the sums that add the samples up (a loss summed over the batch): its pieces' losses add
        roots = {d.atoms.find(input_atoms[n][k]) for n, k in decision.inputs.items()
                 if k is not None and n in input_atoms and input_atoms[n][k] >= 0}
        atoms_of = lineage(d)
        decision.sums = batch_sums(gm, runner.labels, lambda label: any(d.atoms.find(a) in roots for a in atoms_of(label)))
    if loss_failed is not None and decision.size:  # the target's dims unseen: each target's first dim of the batch's size
        leaves = pytree.tree_leaves(meta_target)
        decision.target = tuple(next((k for k, s in enumerate(t.shape) if s == decision.size), None)
                                if isinstance(t, torch.Tensor) else None for t in leaves)
        decision.unproven.append(f"the loss did not run on meta ({loss_failed}): the target cut along its dim of "
                                 "the batch's size")
    return decision


def _sequence(d: Discovery, gm: fx.GraphModule, names: Sequence[str], input_atoms: dict[str, tuple[int, ...]],
              target_atoms: list[tuple[int, ...] | None], outputs: list[Any], batch: Decision) -> SequenceDims | None:
    """The class of the input dims an attention call (SDPA) mixes, and where every input, target leaf
    and output holds it. With no attention call, the mixed dim a position table lines up with (its
    mixers then name what --cp cannot cut); None when neither is found."""
    atoms = d.atoms
    attention = {n.name for n in gm.graph.nodes if n.op == "call_function" and classify(n, gm) == OpKind.ATTENTION}
    found: dict[int, int] = {}  # root -> how many inputs hold it
    for name in names:
        for a in input_atoms.get(name, ()):
            if a >= 0 and any(node in attention for node, _ in atoms.mixed_by(a)):
                found[atoms.find(a)] = found.get(atoms.find(a), 0) + 1
    if not found:  # no attention call: the mixed dim a position table lines up with, so --cp names what mixes it
        for name in names:
            for a in input_atoms.get(name, ()):
                if a >= 0 and atoms.fixed[atoms.find(a)] and any(node for node, _ in atoms.mixed_by(a)):
                    found[atoms.find(a)] = found.get(atoms.find(a), 0) + 1
    if not found:
        return None
    root = max(found, key=found.__getitem__)
    merged: list[str] = []

    def dim_of(labels: Sequence[Sequence[int]], what: str) -> int | None:
        dims = [k for k, lab in enumerate(labels) if any(a >= 0 and atoms.find(a) == root for a in lab)]
        if len(dims) != 1:
            if dims:
                merged.append(f"{what} (dims {', '.join(map(str, dims))})")
            return None
        if len(labels[dims[0]]) > 1:
            merged.append(f"{what} dim {dims[0]}")
            return None
        return dims[0]

    inputs = {n: dim_of([d.expand((a,)) if a >= 0 else (a,) for a in input_atoms[n]], f"input {n!r}") if n in input_atoms else None
              for n in names}
    target = tuple(dim_of([d.expand((a,)) if a >= 0 else (a,) for a in t], f"target leaf {i}") if t is not None else None
                   for i, t in enumerate(target_atoms))
    outs = tuple(dim_of(d.value(t).labels, f"output {i}") if isinstance(t, torch.Tensor) else None
                 for i, t in enumerate(outputs))
    unmatched = []
    for what, found_atoms, batch_dim in [
            *((f"input {n!r}", input_atoms[n], batch.inputs.get(n)) for n in names if n in input_atoms),
            *((f"target leaf {i}", t, batch.target[i] if i < len(batch.target) else None)
              for i, t in enumerate(target_atoms) if t is not None)]:
        for k, a in enumerate(found_atoms):
            if a < 0 or k == batch_dim or atoms.find(a) == root or atoms.size[a] != atoms.size[root] \
                    or atoms.fixed[atoms.find(a)]:
                continue
            unmatched.append((f"{what} dim {k}", atoms.why_not(a) or "no op ties it to the tokens attention mixes"))
    return SequenceDims(inputs, target, outs, atoms.size[root], tuple(atoms.mixers.get(root, ())), tuple(merged),
                        tuple(unmatched))


def _decide(d: Discovery, names: Sequence[str], input_atoms: dict[str, tuple[int, ...]],
            target_atoms: list[tuple[int, ...] | None], outputs: list[Any], unread: dict[str, torch.Tensor],
            declared: dict[str, int | None] | None = None,
            tail_of: Callable[[frozenset[int]], WholeTail | None] = lambda roots: None,
            output_nodes: Sequence[str | None] = ()) -> Decision:
    atoms = d.atoms
    # candidate classes: an input's dim no op couples and no weight fixes
    votes: dict[int, list[tuple[int, int]]] = {}  # root -> (input index, dim)
    routed: set[int] = set()
    whole: dict[int, str] = {}  # root -> why, for a class only the loss or the model's tail couples
    tails: dict[int, WholeTail | None] = {}  # root -> the model's tail that pairs or couples it (tail.py)
    first_reason = ""
    for i, name in enumerate(names):
        if name in unread:  # no op read it: its dims are untouched, no evidence of anything (cut by size below)
            continue
        for k, a in enumerate(input_atoms.get(name, ())):
            if a < 0 or atoms.find(a) in atoms.alias:  # a dim standing for merged dims is not a class of its own
                continue
            why = atoms.why_not(a)
            loss_why = atoms.loss_couples(a) if why is not None else None
            if why is not None:
                root = atoms.find(a)
                if root not in tails:
                    tails[root] = tail_of(frozenset({root}))
                if tails[root] is not None:
                    loss_why = tails[root].why
            if why is None or loss_why is not None:
                votes.setdefault(atoms.find(a), []).append((i, k))
                if atoms.routed_by(a) is not None:
                    routed.add(atoms.find(a))
                if loss_why is not None:
                    whole[atoms.find(a)] = loss_why
            if why is not None and not first_reason and k == 0:
                first_reason = f"dim 0 of {name!r}: {why}"
    def score(root: int) -> tuple[bool, bool, int, int, int]:
        hits = votes[root]
        return (root not in whole, root not in routed, len({i for i, _ in hits}), -min(k for _, k in hits),
                -min(i for i, _ in hits))

    unproven = list(d.unproven)

    def no_batch(why: str) -> Decision:
        return Decision({n: None for n in names}, tuple(None for _ in target_atoms), tuple(None for _ in outputs), 0,
                        unproven, why)

    if not votes and declared is None:
        return no_batch(first_reason or "no input has a dim of size 2 or more")
    batch = max(votes, key=score) if votes else -1
    if declared is not None:
        batch = _declared_class(d, names, input_atoms, declared)
        if batch < 0:
            return no_batch("batch_dims() gives no batch dim")
    elif batch in routed:
        unproven.append(f"the batch dim is {atoms.routed_by(batch)}: taken to route each example and bring it "
                        "back, as a mixture of experts routes tokens")

    roots = {batch}
    tail = tails.get(batch) if declared is None else None
    if tail is not None:  # another input's batch coupled only in a tail too (a two-tower model's images): cut alike
        others = {r for r in votes if r != batch and tails.get(r) is not None and atoms.size[r] == atoms.size[batch]}
        joined = tail_of(frozenset({batch, *others})) if others else None
        if joined is not None:
            tail, roots = joined, {batch, *others}

    inner: list[str] = []  # values holding the batch inside merged dims, after another: no piece is whole samples
    twice: list[str] = []  # values holding the batch at two dims: each sample paired with others, no cut keeps both

    def dim_of(found: Sequence[int] | None, what: str) -> int | None:
        if not found:
            return None
        dims = []
        for k, a in enumerate(found):
            held = d.expand((a,)) if a >= 0 else ()  # an input's dim standing for merged dims (batch x length)
            if held and atoms.find(held[0]) in roots:
                dims.append(k)
            elif any(atoms.find(x) in roots for x in held[1:]):
                inner.append(f"dim {k} of {what} holds the batch merged after another dim")
        if len(dims) > 1:
            twice.append(f"{what} holds it at dims {dims[0]} and {dims[1]}")
        return dims[0] if len(dims) == 1 else None

    inputs = {n: dim_of(input_atoms.get(n), repr(n)) for n in names}
    target_dims = tuple(dim_of(t, f"target leaf {i}") for i, t in enumerate(target_atoms))
    if inner and declared is None:
        return no_batch(f"{inner[0]} (flattened from a layout whose outer dim is not the batch's): cut into pieces it "
                        "would not hold whole samples")
    if twice and declared is None:  # the model lines one dim of it up with another (samples with channels)
        return no_batch(f"{twice[0]}: the model lines them up, pairing each sample with the rows of another dim")
    if declared is not None:
        inputs.update(declared)
        unread = {}
    for n, t in unread.items():  # only its sizes are read (zeros(x.shape[0], ...)): the batch's size marks it
        k = next((k for k, s in enumerate(t.shape) if s == atoms.size[batch]), None)
        inputs[n] = k
        if k is not None:
            unproven.append(f"{n!r}: only its sizes are read; cut along dim {k}, the batch's size")
    out_dims: list[int | None] = []
    for i, t in enumerate(outputs):
        if not isinstance(t, torch.Tensor) or (tail is not None and i < len(output_nodes)
                                               and output_nodes[i] in tail.nodes):
            out_dims.append(None)  # the tail's outputs: the whole batch's, the same on every replica
            continue
        labels = d.value(t).labels
        dims = [k for k, lab in enumerate(labels) if lab and atoms.find(lab[0]) in roots]
        if len(dims) > 1 and batch in whole:  # image x text logits: each entry pairs two samples, the model
            return no_batch(f"output {i} pairs the samples (its dims {dims[0]} and {dims[1]} both hold the batch): "
                            f"{whole[batch]}")  # couples them, not the loss alone
        out_dims.append(dims[0] if dims else None)
    return Decision(inputs, target_dims,
                    tuple(out_dims), atoms.size[batch], unproven, whole_loss=whole.get(batch, ""),
                    gather=tail.gather if tail is not None else ())


def _declared_class(d: Discovery, names: Sequence[str], input_atoms: dict[str, tuple[int, ...]],
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
    then names what fails) or an input is empty, dim 0 of each (the convention when nothing can be found)."""
    if any(isinstance(t, torch.Tensor) and t.numel() == 0 for t in flat):
        return BatchDims.leading(input_names, flat)
    try:
        found = discover(gm, input_names, flat, output_leaves, loss, target, declared)
    except ModelDidNotRun:  # the analysis runs the graph next and says what fails, and where
        return BatchDims.leading(input_names, flat)
    notes = [f"assumed: {u}" for u in found.unproven]
    if not found.size:
        notes.append(f"no batch: {found.why_none}")
    if found.gather:
        notes.append(f"the model's tail couples the samples ({found.whole_loss}): it runs on the whole batch, one "
                     f"micro-batch per replica, its inputs ({', '.join(n for n, _, _ in found.gather)}) gathered over "
                     "the replicas")
    elif found.whole_loss:
        notes.append(f"the loss couples the samples ({found.whole_loss}): it runs on the whole batch, one "
                     "micro-batch per replica, the replicas' outputs gathered")
    return BatchDims(dict(found.inputs), found.target, found.outputs, found.size,
                     "batch_dims()" if declared is not None else "found", tuple(notes), found.sequence,
                     found.whole_loss, found.gather, found.bags, found.sums)
