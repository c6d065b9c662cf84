"""FLOPs of the ops run under a mode, by torch's own formulas (`torch.utils.flop_counter`'s registry).

torch's `FlopCounterMode` also tracks which module each op runs in (global module hooks that flatten
every call's arguments): a tenth of an 80-layer model's analysis, for a breakdown the analysis never
reads. This mode counts as it does (an op without a formula decomposed first, as FlopCounterMode does;
size and stride queries passed through) and keeps only the total since it was entered.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten
# queries FlopCounterMode passes through untouched
_QUERIES = frozenset({
    aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
    aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
    aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
    torch.ops.prim.layout.default,
})


class FlopCount:
    """`with counter:` counts from 0; `counter.get_total_flops()` after. A higher-order op (torch.cond)
    is run as it is and counts nothing."""

    def __init__(self) -> None:
        self.total = 0
        self._mode: _Counting | None = None

    def __enter__(self) -> FlopCount:
        self.total = 0
        self._mode = _Counting(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        mode, self._mode = self._mode, None
        assert mode is not None
        return mode.__exit__(*exc)

    def get_total_flops(self) -> int:
        return self.total


class _Counting(TorchDispatchMode):
    def __init__(self, counter: FlopCount) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _QUERIES or isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        if func not in flop_registry and func is not torch.ops.prim.device.default:
            with self:
                found = func.decompose(*args, **kwargs)
            if found is not NotImplemented:
                return found
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.counter.total += formula(*args, **kwargs, out_val=out)
        return out
