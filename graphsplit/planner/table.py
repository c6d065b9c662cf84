"""`OpTable`: one variant (tp degree x precision) of the whole op sequence, as arrays the search prices
plans from: per op, per cut, per storage and per parameter."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .rings import DROPPED


@dataclass
class OpTable:
    """One variant of the whole op sequence; pairs are (per sample, constant)."""

    tp: int
    low: bool
    flops: tuple[np.ndarray, np.ndarray]
    bytes: tuple[np.ndarray, np.ndarray]
    kept: list[tuple[int, ...]]  # per op: the storages it keeps for backward (ids into `storage`)
    storage: tuple[np.ndarray, np.ndarray]  # per storage id: its bytes
    storage_keys: list[tuple[str, int, int]]  # per storage id: (the node that made it, its copy, index)
    out: tuple[np.ndarray, np.ndarray]  # the op's output
    selective: tuple[np.ndarray, np.ndarray]  # what selective checkpointing keeps of it (its matmul outputs)
    live: tuple[np.ndarray, np.ndarray]  # per cut 0..n: bytes live across it
    blocked: np.ndarray  # per cut: a container is live across it
    low_rate: np.ndarray  # bool: runs at the low-precision matmul rate
    fp8: np.ndarray  # bool: a linear --fp8 runs in float8 (passes/float8.py's choice)
    fp8_cast: tuple[np.ndarray, np.ndarray]  # such a linear's input and weight bytes, which it casts first
    compute: np.ndarray  # bool: a matmul-class op (selective checkpointing keeps its output)
    # per op: of `selective`, its attention's outputs (always kept); the matmul calls it makes
    # (`selective:K` keeps one in K of a region's, counted in order: ops/activation_checkpoint.py)
    selective_attention: tuple[np.ndarray, np.ndarray]
    matmul_calls: np.ndarray
    block: np.ndarray  # the repeated block each op lies in (index into `blocks`), -1 outside
    blocks: list[str]
    block_inputs: dict[int, tuple[tuple[int, int], tuple[int, int]]]  # block -> ((stream), (shared)) bytes pairs
    reads: list[tuple[tuple[int, int, int, int], ...]]  # per op: (value id, producer position, bytes pair) it reads
    params: list[tuple[str, ...]]  # per op: the parameters it reads (canonical names)
    param_bytes: dict[str, int]  # per tp rank, as stored (fp32)
    param_shapes: dict[str, tuple[int, ...]]  # per tp rank (FSDP shards dim 0 of these over dp)
    # (op, direction, kind, bytes per sample, constant): tp's collectives, and "all_to_all" for the rows an
    # expert layer would exchange under expert parallelism (its first grouped linear's input, its last's output)
    collectives: list[tuple[int, str, str, int, int]]
    output: tuple[int, int]  # the model's output tensors on the last stage
    # (first, length, end): ops [first, end) are copies of one block, each `length` ops, every copy
    # priced as the one before it (a folded profile's blocks 1..L-1); None when nothing repeats
    period: tuple[int, int, int] | None = None
    # per op: a grouped linear (a mixture of experts' [E, ..] weights: expert parallelism slices them)
    grouped: np.ndarray | None = None
    # per op: the bytes it moves of expert weights and their copies (a cast to bf16, a transpose), and per
    # storage: made from expert weights alone. Under expert parallelism a rank holds 1/ep of them
    expert_bytes: np.ndarray | None = None
    expert_storage: np.ndarray | None = None
    # per op: a cast of parameters alone to the low dtype (a matmul's weight cast under autocast); per
    # storage: made by one. Under FSDP with a low param dtype neither exists (`for_gathered_low`)
    weight_cast: np.ndarray | None = None
    cast_storage: np.ndarray | None = None
    # per storage: where in the sequence the op whose output it is lies (-1: not known, an input). An op
    # keeps its own output (a softmax, an attention) where a storage it keeps is made there; a matmul
    # keeps only its inputs
    storage_maker: np.ndarray | None = None
    # per op: a plain GEMM's inner and output dims as this tp rank runs it (K, N; 0 where not one), so its
    # rate follows its shape (gemm_table.py); its rows M are its FLOPs / (2 K N) at any micro-batch size
    # per op: the written-out attention core it lies in (analysis/attention_cores.py), -1 none: the regions
    # `--checkpoint attention` recomputes
    core: np.ndarray | None = None
    # per op: a float8 linear's input and weight elements (its casts' passes move bytes per element)
    fp8_elems: tuple[np.ndarray, np.ndarray] | None = None
    gemm_k: np.ndarray | None = None
    gemm_n: np.ndarray | None = None
    # --fp8 tensorwise: a float8 linear's operand bytes and elements as it casts them where its gather
    # is float8 (planner/rings.py's `float8_tags`: the shard once, by the gather's first linear); per
    # storage: such a gather's shard, which its linears keep in float8, a byte an element
    fp8_gather_cast: tuple[np.ndarray, np.ndarray] | None = None
    fp8_gather_elems: tuple[np.ndarray, np.ndarray] | None = None
    fp8_shard_storage: np.ndarray | None = None
    # --fp8: the `fp8` linears run at the float8 rate, their operands cast first (`for_fp8`)
    float8: bool = False
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)
    # what follows from the op sequence's structure alone (its blocks, reads, FLOPs and which storages each
    # op keeps), not from bytes: the variants a plan runs (`for_ep`, `for_compiled`, `for_gathered_low`,
    # `for_fp8`) change only bytes, and `dataclasses.replace` hands them this same dict, so the search's
    # thousands of stage shapes are laid out once per table, not once per variant
    structure: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return len(self.params)

    def at(self, pair: tuple[np.ndarray, np.ndarray], b: int) -> np.ndarray:
        """The values of `pair` (one of this table's per-sample + constant arrays) at `b` samples."""
        key = ("at", id(pair[0]), b)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = pair[0] * b + pair[1]
        return found

    def _flat_kept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`kept` as flat arrays: every (op, storage) pair in op order, and where each op's pairs start."""
        found = self.structure.get("flat_kept")
        if found is None:
            sizes = np.fromiter((len(row) for row in self.kept), dtype=np.int64, count=self.n)
            ids = np.fromiter((k for row in self.kept for k in row), dtype=np.int64, count=int(sizes.sum()))
            found = self.structure["flat_kept"] = (ids, np.concatenate([[0], np.cumsum(sizes)]),
                                                   np.repeat(np.arange(self.n), sizes))
        return found

    def kept_ids(self, ops: range | np.ndarray | list[int]) -> np.ndarray:
        """The storages the ops `ops` (a range, or indices) keep for backward, each once, sorted. A range's
        are found once per table and its variants (the search asks for the same stages again and again)."""
        ids, start, owner = self._flat_kept()
        if isinstance(ops, range) and ops.step == 1:
            key = ("kept_ids", ops.start, ops.stop)
            found = self.structure.get(key)
            if found is None:
                found = self.structure[key] = np.unique(ids[start[ops.start]:start[max(ops.stop, ops.start)]])
            return found
        chosen = np.zeros(self.n, dtype=bool)
        chosen[np.asarray(ops, dtype=np.int64)] = True
        return np.unique(ids[chosen[owner]])

    def saved_bytes(self, index: np.ndarray, b: int) -> int:
        """Bytes of the storages `index` (from `kept_ids`) at `b` samples."""
        if not len(index):
            return 0
        return int((self.storage[0][index] * b + self.storage[1][index]).sum())

    def saved(self, ops: range | np.ndarray | list[int], b: int) -> int:
        """Bytes the ops `ops` (a range, or indices) keep for backward when they run in one stage: each
        storage once. A stage holds thousands of ops: their storages are read as one slice or mask."""
        return self.saved_bytes(self.kept_ids(ops), b)

    def expert_params(self) -> dict[str, int]:
        """The expert weights (read by a grouped linear) and how many experts each holds (its dim 0)."""
        found = self.cache.get("experts")
        if found is None:
            grouped = self.grouped if self.grouped is not None else np.zeros(self.n, dtype=bool)
            found = self.cache["experts"] = {name: self.param_shapes[name][0] for i in np.flatnonzero(grouped)
                                             for name in self.params[i] if self.param_shapes.get(name)}
        return found

    def for_ep(self, ep: int) -> OpTable:
        """This table as one expert-parallel rank of `ep` runs it: what moves or keeps expert weights
        (their reads by the grouped matmuls, their casts and the copies kept for backward) is 1/ep."""
        if ep == 1 or self.expert_bytes is None or not self.expert_bytes.any():
            return self
        key = ("for_ep", ep)
        found = self.cache.get(key)
        if found is None:
            less = (self.expert_bytes - self.expert_bytes // ep).astype(self.bytes[1].dtype)
            storage = self.storage[1].copy()
            if self.expert_storage is not None:
                storage[self.expert_storage] //= ep
            found = self.cache[key] = dataclasses.replace(
                self, bytes=(self.bytes[0], self.bytes[1] - less), storage=(self.storage[0], storage), cache={})
        return found

    def keeps_own_output(self, i: int) -> bool:
        """Whether op `i` keeps its own output for backward (unknown makers count as yes)."""
        return self.storage_maker is None or any(self.storage_maker[k] in (i, -1) for k in self.kept[i])

    def recompute_stop(self, lo: int, hi: int) -> int:
        """Where recomputing region [lo, hi) ends: torch's non-reentrant checkpoint stops once every tensor
        the region kept is recomputed (its early stop). The last op that keeps anything runs again only
        when it keeps its own output: a matmul packs its inputs before it runs. So a block's last
        projection and its residual add do not run again."""
        key = ("stop", lo, hi)
        found = self.structure.get(key)
        if found is None:
            keeping = [i for i in range(lo, hi) if self.kept[i]]
            if not keeping:
                found = lo
            else:
                last = keeping[-1]
                found = last + 1 if self.keeps_own_output(last) else last
            self.structure[key] = found
        return found

    def pieces(self, at_collectives: bool = False) -> np.ndarray:
        """Each op's run of ops between matmul-class ops (which stay library kernels; with `at_collectives`,
        between tp collectives too, which stay eager between compiled pieces): its index, -1 for a
        breaking op."""
        key = ("pieces", at_collectives)
        found = self.cache.get(key)
        if found is None:
            breaks = self.compute.copy()
            if at_collectives:
                for op, _, kind, *_ in self.collectives:
                    if kind != "all_to_all":
                        breaks[op] = True
            starts = np.concatenate([[True], breaks[:-1]]) & ~breaks  # a run begins after a break, or at 0
            found = self.cache[key] = np.where(breaks, -1, np.cumsum(starts) - 1)
        return found

    def for_fp8(self, recipe: str, rings: bool = False) -> OpTable:
        """This table as --fp8 `recipe` runs it: its float8 linears at the float8 rate, each operand cast
        first (stages.op_seconds); under tensorwise scaling, a gather its float8 column linears alone read
        moves a byte an element, its linears' re-gathers are one, the shard is cast once and kept in
        float8 (planner/rings.py's `float8_tags`). No ring at a site with a float8 linear, but where
        `rings` (--async-tp) and tensorwise: there the ring moves the float8 bytes (ops/float8_ring.py), its
        casts priced as a plain float8 linear's (compiled kernels under --compile)."""
        key = ("fp8", recipe, rings)
        found = self.cache.get(key)
        if found is None:
            gathers = recipe == "tensorwise" and self.fp8_gather_cast is not None
            collectives = []
            for c in self.collectives:
                tag = c[6] if len(c) > 6 else None
                if tag is None:
                    collectives.append(c)
                    continue
                ringed, moved = tag
                if gathers and moved == DROPPED:
                    continue
                pair = moved if gathers and moved is not None else c[3:5]
                ring = c[5] if gathers and rings and ringed else None
                if ring is not None and ring != DROPPED and moved is not None:  # the ring moves the float8 bytes
                    ring = (*pair, *ring[2:])
                collectives.append((*c[:3], *pair, ring, tag))
            changes: dict[str, Any] = {"float8": True, "collectives": collectives, "cache": {}}
            if gathers:
                changes.update(fp8_cast=self.fp8_gather_cast, fp8_elems=self.fp8_gather_elems)
                if self.fp8_shard_storage is not None and self.fp8_shard_storage.any():
                    size = 2 if self.low else 4
                    changes["storage"] = tuple(np.where(self.fp8_shard_storage, x // size, x) for x in self.storage)
            found = self.cache[key] = dataclasses.replace(self, **changes)
        return found

    def for_compiled(self) -> OpTable:
        """This table as torch.compile keeps activations: each compiled piece (the ops between two
        matmul-class ops or tp collectives, which stay library kernels and eager collectives) is
        partitioned by AOTAutograd, which recomputes a piece's cheap ops in backward rather than
        save their outputs where saving the piece's inputs costs fewer bytes. So the storages a piece
        makes and something keeps are priced at most as the inputs it reads from outside (those not
        kept whole already: a matmul's output the piece reads is kept anyway). A SwiGLU keeps its two
        matmul outputs, not the silu and product; attention's rotated, GQA-expanded keys are
        recomputed from the projections. Measured: a compiled stage kept 0.77x of eager's saved bytes
        for the Llama example on CPU, about 0.76x of the activations on an H200 (bench/gpu_stage.py)."""
        if self.storage_maker is None:
            return self
        found = self.cache.get("compiled")
        if found is None:
            group = self.pieces(at_collectives=True)
            maker = self.storage_maker
            made_in = np.where(maker >= 0, group[np.maximum(maker, 0)], -1)
            inside = made_in >= 0  # made by a piece's cheap op: recomputable in backward
            whole = {int(m) for m in maker[~inside & (maker >= 0)]}  # made by a matmul or collective: kept
            count = int(group.max()) + 1 if len(group) else 0
            made = np.bincount(made_in[inside], weights=self.storage[0][inside].astype(np.float64), minlength=count)
            inputs = np.zeros(count)
            seen: set[tuple[int, int]] = set()
            for i in np.flatnonzero(group >= 0).tolist():
                g = int(group[i])
                for vid, producer, per_sample, _ in self.reads[i]:
                    if (producer >= 0 and group[producer] == g) or producer in whole or (g, vid) in seen:
                        continue
                    seen.add((g, vid))
                    inputs[g] += per_sample
            factor = np.where(made > 0, np.minimum(1.0, inputs / np.maximum(made, 1e-30)), 1.0)
            scale = np.where(inside, factor[np.maximum(made_in, 0)], 1.0)
            storage = tuple(np.rint(x * scale).astype(np.int64) for x in self.storage)
            found = self.cache["compiled"] = dataclasses.replace(self, storage=storage, cache={})
        return found

    def for_gathered_low(self) -> OpTable:
        """This table as FSDP runs it under --autocast bf16/fp16: the parameters are gathered in the low
        dtype (apply_fsdp's MixedPrecisionPolicy), so a matmul's weight cast returns the gathered weight
        itself: it moves no bytes, and what the matmul keeps for backward is FSDP's gathered parameter
        (priced with FSDP's buffers), not a copy per micro-batch. (The fp32 copies the program makes under
        FSDP of a weight read outside a matmul, a norm's or an embedding's table, are not priced: each is
        made and dropped within its op's forward, not kept for backward.)"""
        if not self.low or self.weight_cast is None or not self.weight_cast.any():
            return self
        found = self.cache.get("gathered_low")
        if found is None:
            gone = self.weight_cast
            kept = self.cast_storage if self.cast_storage is not None else np.zeros(len(self.storage[0]), dtype=bool)
            found = self.cache["gathered_low"] = dataclasses.replace(
                self, bytes=tuple(np.where(gone, 0, x) for x in self.bytes), out=tuple(np.where(gone, 0, x) for x in self.out),
                storage=tuple(np.where(kept, 0, x) for x in self.storage), cache={})
        return found
