"""What the fx tracer decides while it traces, each kept as a check in the graph: conditions on sizes
(size_conditions.py), checks on values that only raise (value_checks.py), branches on the model's own
buffers, `len()` and iteration of sizes, `int()` of a size condition, and a buffer's `.grad` read in
forward. The tracer's proxy asks the tracer for each."""

from __future__ import annotations

import linecache
import operator
import sys
from types import FrameType
from typing import Any

import torch
import torch.fx as fx

from .grad_regions import GradModeProxy
from .meta import info
from .size_conditions import (
    DECIDED,
    Unknown,
    check_message,
    condition_frame,
    count_message,
    length_message,
    where,
)
from .user_source import user_source
from .value_checks import VALUE_CHECK, ValueCheck, check_at
from .value_checks import check_message as value_check_message


def grad_is_none(t: torch.Tensor) -> bool:
    return t.grad is None


class _Sizes:
    """What a traced value answers from the example inputs' sizes: `len()` (None: fx's own error, the model
    goes to export) and a slice of a shape (`x.shape[:-1]`: its entries, fx's getitem otherwise)."""

    tracer: Any

    def __len__(self) -> int:
        n = self.tracer.length(self)
        return super().__len__() if n is None else n  # type: ignore[misc]

    def __getitem__(self, key: Any) -> Any:
        sliced = self.tracer.shape_slice(self, key)
        return super().__getitem__(key) if sliced is None else sliced  # type: ignore[misc]


class Proxy(_Sizes, GradModeProxy):
    """fx's Proxy has no length; `len(src)` of an input is often known from the example inputs."""

    def __getattr__(self, name: str) -> Any:
        if name == "grad":  # `if exists(self.buffer.grad):` in forward: the model's state, not the data
            return self.tracer.grad_of(self)
        if name == "ndim" and (n := self.tracer.ndim(self)) is not None:
            return n  # a graph's tensors keep their number of dims (einops' layers key a dict by it)
        return _Attribute(self, name)

    def __index__(self) -> int:
        """`for i in range(t)` with t a size known from the example inputs (a recurrence over the sequence):
        unrolled to that count, the count checked (torch.export unrolls it alike). Only for `range()`:
        torch's argument parser asks `__index__` too (`torch.arange(T)`), where the size stays traced."""
        n = self.tracer.count(self) if _calling_range(sys._getframe(1)) else None
        if n is None:
            raise TypeError(f"'{self.node.name}' is no size known from the example inputs")
        return n

    def __setitem__(self, key: Any, value: Any) -> None:
        """`frequency_list[0] = 0`, `y[idx] += out`: recorded as written (ir/aliasing.py follows the write)."""
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def __int__(self) -> int:
        """`int(x == -1)` of a size condition (einops' unpack counts unknown dims so): decided and
        checked as `bool()` is. `int()` of a size stays fx's failure: torch.export keeps it symbolic,
        where a constant would hold the example's batch."""
        decided = self.tracer.condition_int(self)
        if decided is None:
            raise TypeError(f"int() of {self.node.name} while tracing")
        return decided


def _calling_range(frame: FrameType) -> bool:
    """Whether the call `frame` is making is `range(...)` (its source at the instruction's position)."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None:
        return False
    line, _, col, _ = list(positions())[frame.f_lasti // 2]
    if line is None or col is None:
        return False
    text = linecache.getline(frame.f_code.co_filename, line)[col:]
    return text.startswith("range(")


class _Attribute(_Sizes, fx.proxy.Attribute):
    """`x.shape` as fx makes it, with the length a shape has: `b, n, d, e = *x.shape, self.num_experts`
    asks `len()` of the shape before it iterates it."""


class DecidingTracer(fx.Tracer):
    """The decisions of graphsplit's tracer (trace.py's `_Tracer`, which sets `sizes`, `conditions`,
    `value_checks` and `state_branches`)."""

    sizes: Any
    conditions: list[str]
    value_checks: list[str]
    state_branches: list[str]

    def to_bool(self, obj: fx.Proxy) -> bool:
        """`assert t <= 64`, `if x.size(1) > 1:` on sizes known from the example inputs: decided here and
        checked in the graph, so a call that decides it the other way fails (size_conditions.py)."""
        try:
            if self.sizes is None:
                raise Unknown(obj.node.name)
            decided = bool(self.sizes.plain(obj.node))
        except Unknown:
            # a condition on tensor values: a check the model makes (`if labels.max() >= V: raise`) is taken
            # the way that does not raise and kept as a check (value_checks.py); any other branch: fx's error,
            # and the model goes to torch.export
            check = check_at(condition_frame(sys._getframe(1)))
            if check is None:
                return self._state_branch(obj)
            node = self.create_proxy("call_function", ValueCheck(check.holds, check.error, value_check_message(check)),
                                     (obj,), {}).node
            info(node).extra[VALUE_CHECK] = True
            self.value_checks.append(check.place)
            return check.holds
        place = self._place()
        holds = obj if decided else self.create_proxy("call_function", operator.not_, (obj,), {})
        self._check(holds, place, check_message(place, decided))
        return decided

    def _state_branch(self, obj: fx.Proxy) -> bool:
        """`if self.freqs_cos[0, 0] == 0:` (recompute a table the constructor may have left empty): a
        branch on the model's own buffers, decided by their values (`SizeValues.state`) and kept as a
        check that raises if a run's buffers decide it the other way; any other branch on values is
        fx's error, and the model goes to torch.export."""
        try:
            if self.sizes is None:
                raise Unknown(obj.node.name)
            value = self.sizes.state(obj.node)
            decided = bool(value)
        except (Unknown, RuntimeError):
            return super().to_bool(obj)
        place = self._place()
        message = (f"{place}: graphsplit traced the branch the model's buffers took when it was built "
                   f"({decided}), and they now take the other")
        node = self.create_proxy("call_function", ValueCheck(decided, RuntimeError, message), (obj,), {}).node
        info(node).extra[VALUE_CHECK] = True
        self.state_branches.append(place)
        return decided

    def condition_int(self, obj: fx.Proxy) -> int | None:
        """`int()` of a size condition: 0 or 1, decided and checked (None: not a condition on sizes)."""
        try:
            if self.sizes is None:
                raise Unknown(obj.node.name)
            value = self.sizes.plain(obj.node)
        except Unknown:
            return None
        if not isinstance(value, bool):
            return None
        place = self._place()
        holds = obj if value else self.create_proxy("call_function", operator.not_, (obj,), {})
        self._check(holds, place, check_message(place, value))
        return int(value)

    def grad_of(self, obj: fx.Proxy) -> Any:
        """`.grad` of a buffer or parameter read in forward (vector-quantize-pytorch's EMA adds a gradient
        it may have been given): None where the model's tensor has none when traced, kept as a check that
        raises if a run finds one; anything else stays fx's attribute."""
        node = obj.node
        if node.op != "get_attr" or self.sizes is None:
            return fx.Proxy.__getattr__(obj, "grad")
        try:
            held = self.sizes._attribute(str(node.target))
        except Unknown:
            return fx.Proxy.__getattr__(obj, "grad")
        if held.grad is not None:
            return fx.Proxy.__getattr__(obj, "grad")
        place = self._place()
        message = f"{place}: graphsplit traced {node.target}.grad as None, as the model held it, and a run finds one"
        none = self.create_proxy("call_function", grad_is_none, (obj,), {})
        check = self.create_proxy("call_function", ValueCheck(True, RuntimeError, message), (none,), {}).node
        info(check).extra[VALUE_CHECK] = True
        self.state_branches.append(place)
        return None

    def length(self, obj: fx.Proxy) -> int | None:
        """`len(src)` of an input whose size is known from the example inputs (None: not known). The
        length becomes a constant of the graph; a call with another length fails its check."""
        try:
            if self.sizes is None:
                raise Unknown(obj.node.name)
            value = self.sizes(obj.node)
        except Unknown:
            return None
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            n, measured = value.shape[0], self.create_proxy("call_method", "size", (obj, 0), {})
        elif isinstance(value, tuple):  # `len(x.shape)`: the number of dims
            n, measured = len(value), self.create_proxy("call_function", len, (obj,), {})
        else:
            return None
        holds = self.create_proxy("call_function", operator.eq, (measured, n), {})
        place = self._place()
        self._check(holds, place, length_message(place, n))
        return n

    def ndim(self, obj: fx.Proxy) -> int | None:
        """The number of dims of a traced tensor, from its value on meta (None: not known)."""
        try:
            value = self.sizes(obj.node) if self.sizes is not None else None
        except Unknown:
            return None
        return value.dim() if isinstance(value, torch.Tensor) else None

    def count(self, obj: fx.Proxy) -> int | None:
        """A size used as a count (`range(t)`): its value on the example inputs, checked in the graph."""
        try:
            value = self.sizes.plain(obj.node) if self.sizes is not None else None
        except Unknown:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        place = self._place()
        holds = self.create_proxy("call_function", operator.eq, (obj, value), {})
        self._check(holds, place, count_message(place, value))
        return value

    def shape_slice(self, obj: fx.Proxy, key: Any) -> tuple[Any, ...] | None:
        """`x.shape[:-1]` of a shape whose length is known from the example inputs: its entries one by one,
        so `x.reshape(x.shape[:-1] + (-1, 2))` is a reshape to listed sizes, as `x.view(b, t, h, d)` is,
        the length checked (None: not a slice of a shape; fx's getitem stands)."""
        if not isinstance(key, slice) or any(isinstance(k, fx.Proxy) for k in (key.start, key.stop, key.step)):
            return None
        node = obj.node  # only a shape is looked at: a tensor's slice is evaluated nowhere here
        if not ((node.target is getattr and node.args[1:] == ("shape",))
                or (node.op == "call_method" and node.target == "size" and len(node.args) == 1 and not node.kwargs)):
            return None
        try:
            value = self.sizes(obj.node) if self.sizes is not None else None
        except Unknown:
            return None
        if not isinstance(value, tuple):
            return None
        n = self.length(obj)
        return None if n is None else tuple(obj[i] for i in range(n)[key])

    def iter(self, obj: fx.Proxy) -> Any:
        """`*x.shape[:-1]`, `for d in x.shape`: a shape's entries one by one, its number of dims known
        from the example inputs and checked (a tensor's rows are not unrolled: fx's error stands)."""
        try:
            value = self.sizes(obj.node) if self.sizes is not None else None
        except Unknown:
            value = None
        if not isinstance(value, tuple):
            return super().iter(obj)
        n = self.length(obj)
        if n is None:
            return super().iter(obj)
        return iter([obj[i] for i in range(n)])

    def _place(self) -> str:
        # frames: _place <- to_bool/length <- the proxy's __bool__/__len__ (or iter <- __iter__) <- the code
        frame = sys._getframe(2)
        if frame.f_code is DecidingTracer.iter.__code__:
            frame = frame.f_back.f_back
        return where(condition_frame(frame), user_source(frame))

    def _check(self, holds: fx.Proxy, place: str, message: str) -> None:
        check = self.create_proxy("call_function", torch._assert, (holds, message), {})
        info(check.node).extra[DECIDED] = True
        self.conditions.append(place)
