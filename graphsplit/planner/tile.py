"""A deep model's table from a short one: measure a few copies of the folded block, tile the rest.

The profile's tables are arrays over the whole op sequence, and walking that sequence in Python is
what costs (Llama 3 405B: 126 blocks, 10,000 ops, eight tables). A folded model's copies of its
block are alike from the third on: each reads the copy before it and the head's shared values
exactly as the one before did. So `profile.py` measures a model of `SHORT` copies (head, block 0,
copies 1..SHORT-1, tail), and `expand` inserts copies of its copy `T = SHORT - 2` after it, each
one the template moved along the sequence: its ops, its cuts, the values it reads (those of the
copy before it one copy on), the storages it keeps (keyed by the copy that made them), its
parameters and block renamed. Copies after the template and the tail move back by the inserted
length. The result is what measuring the whole sequence gives, field for field (tests/test_planner.py).
"""

from __future__ import annotations

import numpy as np

from .fold import Fold
from .table import OpTable

SHORT = 5  # copies 1..4 of the folded block: copy 3 reads a copy of a copy (copy 1 reads block 0) and
#            is not the last (the tail reads the last one, and the head's shared values die there)


def short_fold(whole: Fold) -> Fold | None:
    """The fold to measure instead of `whole`, or None when `whole` is short already."""
    return Fold(whole.blocks[:SHORT]) if whole.count > SHORT else None


def _rename(name: str, old: str, new: str) -> str:
    return new + name[len(old):] if name == old or name.startswith(old + ".") else name


def expand(table: OpTable, short: Fold, whole: Fold) -> OpTable:
    """`table`, measured over `short`'s copies, as the whole model's table."""
    first, length, _end = table.period
    t = short.count - 2  # the template copy
    extra = whole.count - short.count  # copies inserted after it
    start, stop = first + (t - 1) * length, first + t * length  # the template's ops
    shift = extra * length
    n = table.n

    def per_op(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values[:stop], np.tile(values[start:stop], extra), values[stop:]])

    def pair(values: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return per_op(values[0]), per_op(values[1])

    # where each new op comes from: (old position, inserted copy 1..extra, or 0 where it only moves)
    origin = [(i, 0) for i in range(stop)]
    origin += [(start + i, j) for j in range(1, extra + 1) for i in range(length)]
    origin += [(i, 0) for i in range(stop, n)]

    def copy_name(name: str, i: int, j: int) -> str:
        """A parameter's or block's name, as op `i` of the short table reads it in new copy `j`."""
        if j:
            return _rename(name, short.blocks[t], whole.blocks[t + j])
        if i >= stop:
            for k in range(t + 1, short.count):
                name = _rename(name, short.blocks[k], whole.blocks[k + extra])
        return name

    def moved(at: int, i: int, j: int) -> int:
        """Where the value made at `at` and read by op `i` (copy `j`) lies in the whole sequence."""
        if j:  # the template reads its own copy's values and the copy before it's: both move j copies on
            return at + j * length if at >= start - length else at
        return at + shift if i >= stop and at >= start else at

    params, reads, kept, collectives = [], [], [], []
    keys: dict[tuple[str, int, int], int] = {}
    storage: list[tuple[int, int]] = []
    old_storage = list(zip(table.storage[0].tolist(), table.storage[1].tolist()))
    storage_flags: list[bool] = []
    cast_flags: list[bool] = []
    shard_flags: list[bool] = []
    makers: list[int] = []
    by_op: dict[int, list[tuple[int, str, str, int, int]]] = {}
    for c in table.collectives:
        by_op.setdefault(c[0], []).append(c)
    for new, (i, j) in enumerate(origin):
        params.append(tuple(copy_name(name, i, j) for name in table.params[i]))
        row = []
        for vid, at, ps, c in table.reads[i]:
            where = moved(at, i, j) if at >= 0 else -1
            row.append((where if at >= 0 else -1 - vid, where, ps, c))  # a made value's id: where it is made
        reads.append(tuple(row))
        mine = []
        for sid in table.kept[i]:
            name, copy, index = table.storage_keys[sid]
            if j and t - 1 <= copy <= t:
                copy += j
            elif not j and i >= stop and copy >= t:
                copy += extra
            key = (name, copy, index)
            if key not in keys:
                keys[key] = len(storage)
                storage.append(old_storage[sid])
                storage_flags.append(bool(table.expert_storage[sid]) if table.expert_storage is not None else False)
                cast_flags.append(bool(table.cast_storage[sid]) if table.cast_storage is not None else False)
                shard_flags.append(bool(table.fp8_shard_storage[sid]) if table.fp8_shard_storage is not None else False)
                made = int(table.storage_maker[sid]) if table.storage_maker is not None else -1
                makers.append(moved(made, i, j) if made >= 0 else -1)
            mine.append(keys[key])
        kept.append(tuple(mine))
        collectives += [(new, *c[1:]) for c in by_op.get(i, ())]
    param_bytes, param_shapes = dict(table.param_bytes), dict(table.param_shapes)
    for here, (i, _) in zip(params, origin):
        for name, old in zip(here, table.params[i]):
            param_bytes.setdefault(name, table.param_bytes[old])
            param_shapes.setdefault(name, table.param_shapes[old])
    # blocks: the template's, then one per inserted copy, then the later ones one name on
    block = table.block
    mark = int(block[start:stop].max())
    new_block = per_op(block)
    for j in range(1, extra + 1):
        part = new_block[stop + (j - 1) * length: stop + j * length]
        part[part == mark] = mark + j
    tail = new_block[stop + shift:]
    tail[tail > mark] += extra
    names = list(table.blocks[: mark + 1])
    names += [_rename(table.blocks[mark], short.blocks[t], whole.blocks[t + j]) for j in range(1, extra + 1)]
    names += [copy_name(name, n, 0) for name in table.blocks[mark + 1:]]
    block_inputs = {}
    for bi, value in table.block_inputs.items():
        if bi == mark:
            block_inputs.update({mark + j: value for j in range(extra + 1)})
        else:
            block_inputs[bi + extra if bi > mark else bi] = value
    storage_array = np.array(storage, dtype=np.int64).reshape(-1, 2)
    return OpTable(
        tp=table.tp, low=table.low, flops=pair(table.flops), bytes=pair(table.bytes), kept=kept,
        storage=(storage_array[:, 0], storage_array[:, 1]), storage_keys=list(keys),
        out=pair(table.out), selective=pair(table.selective), live=pair(table.live), blocked=per_op(table.blocked),
        selective_attention=pair(table.selective_attention), matmul_calls=per_op(table.matmul_calls),
        low_rate=per_op(table.low_rate), fp8=per_op(table.fp8), fp8_cast=pair(table.fp8_cast), compute=per_op(table.compute), block=new_block, blocks=names,
        block_inputs=block_inputs, reads=reads, params=params, param_bytes=param_bytes, param_shapes=param_shapes,
        collectives=collectives, output=table.output, period=(first, length, first + (whole.count - 1) * length),
        grouped=per_op(table.grouped) if table.grouped is not None else None,
        expert_bytes=per_op(table.expert_bytes) if table.expert_bytes is not None else None,
        expert_storage=np.array(storage_flags, dtype=bool) if table.expert_storage is not None else None,
        weight_cast=per_op(table.weight_cast) if table.weight_cast is not None else None,
        cast_storage=np.array(cast_flags, dtype=bool) if table.cast_storage is not None else None,
        storage_maker=np.array(makers, dtype=np.int64) if table.storage_maker is not None else None,
        core=per_op(table.core) if table.core is not None else None,
        fp8_elems=pair(table.fp8_elems) if table.fp8_elems is not None else None,
        gemm_k=per_op(table.gemm_k) if table.gemm_k is not None else None,
        gemm_n=per_op(table.gemm_n) if table.gemm_n is not None else None,
        fp8_gather_cast=pair(table.fp8_gather_cast) if table.fp8_gather_cast is not None else None,
        fp8_gather_elems=pair(table.fp8_gather_elems) if table.fp8_gather_elems is not None else None,
        fp8_shard_storage=np.array(shard_flags, dtype=bool) if table.fp8_shard_storage is not None else None,
    )
