"""The analyses' shortcuts on meta give what torch gives: plain pointwise ops answered without torch's
Python meta kernels (ir/fast_meta.py), FLOPs counted without FlopCounterMode's module tracking
(analysis/flop_count.py)."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from graphsplit.analysis.flop_count import FlopCount
from graphsplit.ir.fast_meta import KEEP_FLOAT, FastMetaPointwise, plain_output
from graphsplit.loader import load_model

from .conftest import EXAMPLES

aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_a_plain_pointwise_op_gives_the_shape_dtype_and_strides_torch_gives():
    cases = [
        (aten.mul.Tensor, (_meta(4, 8, 16), _meta(16))),
        (aten.mul.Tensor, (_meta(4, 1, 16, dtype=torch.bfloat16), _meta(8, 1, dtype=torch.bfloat16))),
        (aten.add.Tensor, (_meta(2, 3), 1.5)),
        (aten.sub.Tensor, (_meta(2, 3), _meta(2, 3))),
        (aten.div.Tensor, (_meta(5, 7), _meta(1))),
        (aten.pow.Tensor_Scalar, (_meta(3, 4), 2)),
        (aten.rsqrt.default, (_meta(6, 1),)),
        (aten.gelu.default, (_meta(2, 9),)),
    ]
    for op, args in cases:
        assert op in KEEP_FLOAT
        mine = plain_output(args, {})
        theirs = op(*args)
        assert mine is not None, op
        assert (mine.shape, mine.dtype, mine.stride(), mine.device) == \
            (theirs.shape, theirs.dtype, theirs.stride(), theirs.device), op


def test_anything_not_plain_runs_the_op():
    transposed = _meta(8, 4).t()
    assert plain_output((transposed, _meta(4, 8)), {}) is None  # not contiguous: the kernel picks the strides
    assert plain_output((_meta(4), _meta(4, dtype=torch.bfloat16)), {}) is None  # promotion
    assert plain_output((_meta(4, dtype=torch.int64), 2), {}) is None  # integers
    assert plain_output((torch.empty(4), torch.empty(4)), {}) is None  # not meta
    assert plain_output((_meta(4),), {"out": _meta(4)}) is None
    with FastMetaPointwise():
        got = transposed * _meta(4, 8)
    want = aten.mul.Tensor(transposed, _meta(4, 8))
    assert (got.shape, got.stride()) == (want.shape, want.stride())


def test_flop_count_equals_torchs_counter_op_by_op():
    model = load_model(str(EXAMPLES / "llama.py"))
    module = model.build("meta")
    tokens = torch.zeros(2, 32, dtype=torch.long, device="meta")
    theirs = FlopCounterMode(display=False)
    with theirs:
        module(tokens).sum().backward()
    mine = FlopCount()
    with mine:
        module(tokens).sum().backward()
    assert mine.get_total_flops() == theirs.get_total_flops() > 0
