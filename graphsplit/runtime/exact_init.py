"""Initialize only the parameters this rank holds, with exactly the values the whole model would get.

`exact_build(loaded, seed, keep)` runs the model's own constructor (its own init
code, HF `post_init` included) with the plan's seed, but every parameter not in
`keep` is a `_Sink`: a tensor with a shape and no storage. Writes into a sink
are dropped; a random fill of a sink still draws its numbers (into a scratch
tensor of the same size and strides, thrown away), so the random stream the
kept parameters see is the one the whole model's build sees, and their values
are identical. Memory: the kept parameters, the buffers, and one scratch tensor.

Parameters are swapped as they are registered (torch's parameter registration
hook). Which parameter a registration creates is found by a first build on
`meta`: the n-th registration there names the n-th one here (constructors are
deterministic). If init code reads a sink (a value that would depend on a
dropped tensor), `ExactInitUnsupported` is raised and the caller builds the
whole model instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves, tree_map_only

from ..errors import GraphsplitError
from ..loader import LoadedModel, forked_generators, parameter_registration, seed_generators

aten = torch.ops.aten

# in-place random fills: they advance the generator by an amount that depends on size and strides only
_RANDOM_FILLS = {
    aten.normal_.default, aten.uniform_.default, aten.bernoulli_.float, aten.bernoulli_.Tensor,
    aten.exponential_.default, aten.geometric_.default, aten.log_normal_.default, aten.cauchy_.default,
    aten.random_.default, getattr(aten.random_, "from"), aten.random_.to,
}


class ExactInitUnsupported(Exception):
    """The model's init code reads a parameter this rank does not keep."""


class _Sink(torch.Tensor):
    """A parameter this rank does not keep: shape, dtype and strides, no data."""

    @staticmethod
    def __new__(cls, like: torch.Tensor, draw: bool) -> _Sink:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, like.shape, strides=like.stride(), dtype=like.dtype, device="cpu", requires_grad=like.requires_grad)

    def __init__(self, like: torch.Tensor, draw: bool) -> None:
        self.meta = torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device="meta")
        self.draw = draw  # False: a dry run that only finds out whether exact init works, drawing nothing

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else None
        if func in _RANDOM_FILLS and isinstance(target, _Sink):
            if target.draw:
                scratch = torch.empty_strided(target.shape, target.stride(), dtype=target.dtype)
                func(scratch, *args[1:], **kwargs)  # draw the numbers the real fill would draw
            return target
        mutates_first = bool(func._schema.arguments) and func._schema.arguments[0].is_write
        if mutates_first and isinstance(target, _Sink):
            others = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, torch.Tensor)]
            # a write into a dropped tensor; one parameter's value flowing into another is refused
            # even between two dropped ones, so a dry run with every parameter dropped sees it
            if not any(isinstance(a, _Sink) for a in others):
                return target
        if _is_view(func):  # a view of a dropped tensor is dropped too
            metas = tree_map_only(_Sink, lambda s: s.meta, args)
            out = func(*metas, **kwargs)
            source = next(a for a in tree_leaves(args) if isinstance(a, _Sink))
            return _Sink(out, source.draw) if isinstance(out, torch.Tensor) else out
        raise ExactInitUnsupported(f"init code calls {func} on a parameter this rank does not hold")


def _is_view(func: Any) -> bool:
    return any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.returns) or func in (
        aten.detach.default, aten.alias.default)


@contextmanager
def _registrations(decide: Callable[[int, nn.Module, str, nn.Parameter], nn.Parameter]) -> Iterator[None]:
    """Route every parameter registration through `decide(index, module, name, param) -> param`,
    `index` counting the registrations so far."""
    count = itertools.count()

    def register(module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter:
        return decide(next(count), module, name, param)

    with parameter_registration(register):
        yield


def _names_by_call(loaded: LoadedModel, seed: int) -> tuple[dict[int, str], dict[str, tuple[int, ...]]]:
    """Build on meta: the n-th parameter registration -> the name its tensor ends up with."""
    calls: dict[int, nn.Parameter] = {}

    def note(index: int, module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter:
        if param.device.type != "meta":  # a constructor that cannot run on meta: its parameters moved there
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        calls[index] = param
        return param

    try:
        with forked_generators(), _registrations(note), torch.device("meta"):
            seed_generators(seed)  # the structure the CPU build gets (a width drawn from `random`)
            model = loaded._call_builder()
    except GraphsplitError:  # an op of the constructor's has no meta kernel (.to_sparse()): buffers real
        calls.clear()
        with forked_generators(), _registrations(note):
            seed_generators(seed)
            model = loaded._call_builder()
    first = {id(p): n for n, p in model.named_parameters()}
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return {i: first[id(p)] for i, p in calls.items() if id(p) in first}, shapes


def exact_init_works(loaded: LoadedModel) -> bool:
    """Whether `exact_build` can run this model's constructor: a dry run with every parameter a sink
    (no parameter memory, no random draws)."""
    try:
        exact_build(loaded, 0, set(), draw=False)
    except ExactInitUnsupported:
        return False
    return True


def exact_build(loaded: LoadedModel, seed: int, keep: set[str], draw: bool = True) -> dict[str, torch.Tensor]:
    """The kept parameters and every buffer, valued as in `loaded.build("cpu", seed)`, under every name.

    `draw=False`: random fills of dropped parameters draw nothing (a dry run: the values are not used)."""
    names, shapes = _names_by_call(loaded, seed)

    def decide(index: int, module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter:
        if names.get(index) in keep or isinstance(param, _Sink):
            return param  # kept, or a sink registered again under a tied name
        return nn.Parameter(_Sink(param.detach(), draw), requires_grad=param.requires_grad)

    seed_generators(seed)  # torch, random, numpy: every rank builds the same model
    with _registrations(decide):
        try:
            model = loaded._call_builder()
        except GraphsplitError as exc:  # the loader names the builder; keep our reason visible
            if isinstance(exc.__cause__, ExactInitUnsupported):
                raise exc.__cause__ from None
            raise
    got = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if got != shapes:
        raise ExactInitUnsupported("the constructor built different parameters on meta and on CPU")
    found: dict[str, torch.Tensor] = {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)
                                      if not isinstance(p, _Sink)}
    found.update({n: b for n, b in model.named_buffers(remove_duplicate=False)})
    return found
