"""Batches for `run` from a model file's `train_data()` / `eval_data()`.

Either may return an iterable of batches `(inputs, target)`, each a whole global
batch (inputs a tuple or dict like `example_inputs()`'s), or a map-style
`torch.utils.data.Dataset` of samples `(inputs, target)`, which graphsplit batches
with a `DataLoader`. The global batch size is example_inputs()' batch: the
pipeline's shapes are fixed by it, so every batch has it exactly (a dataset's last
incomplete batch is dropped).

Each dp replica trains on its own share of each global batch:

- a dataset: `DistributedSampler` (seeded with the plan's seed, reshuffled each
  epoch for training) gives replica d every dp-th sample of the epoch's order, and
  its loader batches them by global batch / dp; global batch k is the same set of
  samples at any dp;
- an iterable: replica d takes the d-th contiguous slice of each batch.

A position is the number of global batches drawn; `batches(start=k)` goes on from
batch k exactly (a dataset skips to it through the sampler's order, an iterable is
read past it), so a resumed run sees what an uninterrupted one would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from ..errors import GraphsplitError
from .microbatch import batch_tree_dims, call_dims, merge_outputs, split_microbatches

if TYPE_CHECKING:
    from ..ir.program import Program


@dataclass
class Batch:
    """One batch as the model is called on it, and its target (None: the stand-in target)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    target: Any = None

    def tree(self) -> tuple[Any, ...]:
        return (self.args, self.kwargs, self.target)

    @classmethod
    def from_tree(cls, tree: tuple[Any, ...]) -> Batch:
        return cls(tuple(tree[0]), dict(tree[1]), tree[2])


def batch_rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The batch size of example inputs: the first dim of their first batched tensor."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim():
            return int(value.shape[0])
    raise GraphsplitError("no batched tensor among example_inputs()")


def is_dataset(source: Any) -> bool:
    """A map-style dataset (samples by index), as opposed to an iterable of whole batches."""
    return isinstance(source, Dataset) and not isinstance(source, IterableDataset) and hasattr(source, "__len__")


def _shape(t: torch.Tensor) -> str:
    return f"({', '.join(map(str, t.shape))}{',' if t.dim() == 1 else ''})"


class DataSource:
    """`train_data()` or `eval_data()` of a model file, read the way every rank and the reference read it.

    `example`: example_inputs() as (args, kwargs), which fixes each batch's structure, shapes and
    dtypes; `shuffle`: a dataset's order is reshuffled each epoch (training), with `seed`."""

    def __init__(self, name: str, make: Callable[[], Any], example: tuple[tuple[Any, ...], dict[str, Any]],
                 seed: int = 0, shuffle: bool = True, program: Program | None = None) -> None:
        self.name = name
        self.make = make
        self.example = example
        # the program's batch dims (a seq-first model's batch is its dim 1); without one, dim 0
        self.program = program
        self.rows = program.batch.size if program is not None and program.batch.batched else batch_rows(*example)
        leaves = pytree.tree_leaves(example)
        dims = call_dims(program, *example) if program is not None else [0] * len(leaves)
        self._dim_of = {id(leaf): d for leaf, d in zip(leaves, dims)}
        self.seed = seed
        self.shuffle = shuffle
        self.source = self._call()
        # each epoch of an iterable calls the function again (a generator is read once); the first
        # epoch read uses the call made here
        self._unread: Any = self.source
        if is_dataset(self.source):
            if len(self.source) < self.rows:
                raise GraphsplitError(f"{name}() returned a dataset of {len(self.source)} samples, fewer than one "
                                      f"global batch of {self.rows} (example_inputs()' batch)")
        elif not _iterable(self.source):
            raise GraphsplitError(f"{name}() returned {type(self.source).__name__}; return an iterable of "
                                  "(inputs, target) batches or a map-style torch.utils.data.Dataset")

    def _call(self) -> Any:
        try:
            return self.make()
        except GraphsplitError:
            raise
        except Exception as exc:  # the user's code
            raise GraphsplitError(f"{self.name}() failed: {type(exc).__name__}: {exc}") from exc

    # -- what each replica trains on, and what the reference sees --------------------------------

    def batches(self, replicas: int = 1, replica: int = 0, start: int = 0, cycle: bool = True) -> Iterator[Batch]:
        """Replica `replica`'s share of each global batch from batch `start` on; `cycle`: epoch after
        epoch without end (training), else one pass (evaluation)."""
        if self.rows % replicas:
            raise GraphsplitError(f"the global batch of {self.rows} does not split over {replicas} dp replicas")
        if is_dataset(self.source):
            yield from self._dataset_batches(replicas, replica, start, cycle)
            return
        for index, raw in self._iterable_batches(start, cycle):
            whole = self.check(raw, index, self.rows)
            yield Batch.from_tree(split_microbatches(whole.tree(), replicas, self._dims(whole))[replica]) \
                if replicas > 1 else whole

    def global_batches(self, replicas: int = 1, start: int = 0, cycle: bool = True) -> Iterator[Batch]:
        """The whole global batches, the replicas' shares joined in replica order: the batches the
        untouched model trains on for `run --check`."""
        if not is_dataset(self.source) or replicas == 1:
            yield from self.batches(1, 0, start, cycle)  # an iterable's batch is the global one as given
            return
        streams = [self.batches(replicas, d, start, cycle) for d in range(replicas)]
        for shares in zip(*streams):
            yield Batch.from_tree(merge_outputs([s.tree() for s in shares], self._dims(shares[0])))

    def _dims(self, batch: Batch) -> list[int | None] | None:
        """Batch dims per leaf of `batch.tree()` (None: dim 0 of each)."""
        if self.program is None:
            return None
        return batch_tree_dims(self.program, batch.args, batch.kwargs, batch.target)

    def _iterable_batches(self, start: int, cycle: bool) -> Iterator[tuple[int, Any]]:
        """(global position, raw batch) from `start` on, calling the function again for each new epoch."""
        position = 0
        for epoch in itertools.count():
            source = self._unread if self._unread is not None else self._call()
            self._unread = None
            found = False
            for raw in source:
                found = True
                if position >= start:
                    yield position, raw
                position += 1
            if not found:
                raise GraphsplitError(f"{self.name}() gave no batch" + (f" in epoch {epoch + 1}" if epoch else ""))
            if not cycle:
                return

    def _dataset_batches(self, replicas: int, replica: int, start: int, cycle: bool) -> Iterator[Batch]:
        share = self.rows // replicas
        sampler = DistributedSampler(self.source, num_replicas=replicas, rank=replica, shuffle=self.shuffle,
                                     seed=self.seed, drop_last=True)
        per_epoch = len(sampler) // share  # the same at any dp: len(dataset) // global batch
        epoch, offset = divmod(start, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            order = list(sampler)[offset * share:per_epoch * share]  # resume: skip by index, load nothing
            loader = DataLoader(self.source, batch_size=share, sampler=order, drop_last=True,
                                collate_fn=self._collate)
            for k, raw in enumerate(loader):
                yield self.check(raw, epoch * per_epoch + offset + k, share)
            if not cycle:
                return
            epoch, offset = epoch + 1, 0

    def _collate(self, samples: list[Any]) -> Any:
        from torch.utils.data import default_collate

        first = samples[0]
        if not (isinstance(first, tuple | list) and len(first) == 2):
            raise GraphsplitError(f"{self.name}()'s dataset must give (inputs, target) samples; "
                                  f"sample 0 is {_describe(first)}")
        try:
            inputs, target = default_collate(samples)
        except Exception as exc:  # noqa: BLE001 - samples of different structures or shapes
            raise GraphsplitError(f"{self.name}()'s samples do not stack into a batch: {exc}") from None
        return (tuple(inputs) if isinstance(inputs, list) else inputs, target)

    # -- structure ---------------------------------------------------------------------------

    def check(self, raw: Any, index: int, rows: int) -> Batch:
        """`raw` as a Batch, or one line saying how it differs from example_inputs()."""
        where = f"{self.name}() batch {index}"
        if not (isinstance(raw, tuple | list) and len(raw) == 2):
            raise GraphsplitError(f"{where} is {_describe(raw)}; each batch must be a pair (inputs, target), "
                                  "inputs a tuple or dict like example_inputs()'")
        inputs, target = raw
        ex_args, ex_kwargs = self.example
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if isinstance(inputs, dict):
            if not ex_kwargs or set(inputs) != set(ex_kwargs):
                raise GraphsplitError(f"{where}: inputs have keys {sorted(inputs)}, example_inputs() gives "
                                      + (f"keys {sorted(ex_kwargs)}" if ex_kwargs else f"a tuple of {len(ex_args)}"))
            args, kwargs = (), dict(inputs)
            pairs = [(f"input {k!r}", inputs[k], ex_kwargs[k]) for k in ex_kwargs]
        elif isinstance(inputs, tuple | list):
            if ex_kwargs or len(inputs) != len(ex_args):
                raise GraphsplitError(f"{where}: inputs are a tuple of {len(inputs)}, example_inputs() gives "
                                      + (f"keys {sorted(ex_kwargs)}" if ex_kwargs else f"a tuple of {len(ex_args)}"))
            args, kwargs = tuple(inputs), {}
            pairs = [(f"input {i}", v, e) for i, (v, e) in enumerate(zip(inputs, ex_args))]
        else:
            raise GraphsplitError(f"{where}: inputs are {_describe(inputs)}; give a tuple or dict like example_inputs()'")
        for what, value, ex in pairs:
            if not isinstance(ex, torch.Tensor):
                continue
            dim = self._dim_of.get(id(ex), 0)
            want = tuple(rows if k == dim else s for k, s in enumerate(ex.shape))
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != want or value.dtype != ex.dtype:
                got = f"{_shape(value)} {value.dtype}" if isinstance(value, torch.Tensor) else _describe(value)
                raise GraphsplitError(f"{where}: {what} is {got}, expected ({', '.join(map(str, want))}) {ex.dtype} "
                                      f"(example_inputs()' shapes fix the pipeline's; the batch is {self.rows})")
        target_dims = self.program.batch.target_dims(target) if self.program is not None else None
        for k, leaf in enumerate(pytree.tree_leaves(target)):
            dim = target_dims[k] if target_dims is not None else 0
            if dim is None:
                continue
            if isinstance(leaf, torch.Tensor) and (leaf.dim() <= dim or leaf.shape[dim] != rows):
                along = "rows" if dim == 0 else f"along dim {dim}"
                raise GraphsplitError(f"{where}: the target has shape {_shape(leaf)}, expected {rows} {along} "
                                      "(one per example of the batch)")
        return Batch(args, kwargs, target)


def _iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return not isinstance(value, torch.Tensor | str | bytes | dict)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {_shape(value)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
