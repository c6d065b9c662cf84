"""Random ops under `--check`: found in the graph, named, and made comparable where they can be.

The program and the untouched model cannot draw alike: each pipeline rank has its own generator,
a micro-batch draws its masks before the next micro-batch's, the whole batch draws them in
another order. So dropout (identity at p = 0) runs at p = 0 on both sides while checking
(`no_dropout`, a TorchFunctionMode: the user's model is not edited), and the check says so. Any
other draw (torch.rand in a module, a bernoulli mask) is part of what the model computes: where
the program is one piece in one process (one stage, no tp, one micro-batch, no dp) both sides draw
from the same seeded stream (`seeded`) and agree; elsewhere the check names the draws as what
its results may differ by.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..ir.meta import module_path
from ..ir.op_kinds import Randomness, op_name, randomness
from ..plan import Plan

aten = torch.ops.aten


@dataclass(frozen=True)
class RandomOps:
    """Where a graph draws random numbers: `module (op)` per node, in graph order."""

    dropouts: tuple[str, ...] = ()
    draws: tuple[str, ...] = ()

    def notes(self, matched: bool) -> list[str]:
        """What the check compares, said once per kind (`matched`: `streams_match`)."""
        notes = []
        if self.dropouts:
            notes.append(f"dropout in {_listed(self.dropouts)}: compared with dropout off (p=0) in both the "
                         "program and the untouched model, since their random streams cannot match; "
                         "this --check run trains without dropout")
        if self.draws and matched:
            notes.append(f"random draws in {_listed(self.draws)}: drawn from the same seeded stream in the "
                         "program (one stage, one piece of the batch) and the untouched model")
        elif self.draws:
            notes.append(f"random draws in {_listed(self.draws)}: the program and the untouched model need "
                         "not draw alike (each stage and piece of the batch draws on its own, tp ranks alike); "
                         "results that depend on them are compared as they are and may differ for that "
                         "reason alone (with --pp 1 --tp 1 --dp 1 --microbatches 1 they draw alike)")
        return notes


def _listed(names: tuple[str, ...], shown: int = 6) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _where(node: fx.Node) -> str:
    module = module_path(node)
    if node.op == "call_module":
        return module
    return f"{module or 'the model'} ({op_name(node)})"


def find_random_ops(gm: fx.GraphModule) -> RandomOps:
    """The random ops of a traced graph, by where they are in the user's model."""
    found: dict[Randomness, list[str]] = {Randomness.DROPOUT: [], Randomness.DRAW: []}
    for node in gm.graph.nodes:
        kind = randomness(node, gm)
        if kind is not None and (where := _where(node)) not in found[kind]:
            found[kind].append(where)
    return RandomOps(tuple(found[Randomness.DROPOUT]), tuple(found[Randomness.DRAW]))


def streams_match(plan: Plan) -> bool:
    """Whether the program draws what the untouched model draws from the same seed: one stage, one
    tp rank and one piece of the batch make the same draws in the same order."""
    return plan.num_stages == 1 and plan.tp == 1 and plan.dp * plan.num_microbatches == 1


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Inside, the global RNG starts from `seed` (the caller's state is restored after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _overloads(*packets: Any) -> list[Any]:
    return [getattr(p, o) for p in packets for o in p.overloads()]


# every function that reaches torch's function layer with a dropout probability: (its name, its
# position). The mode sees the outermost call only (inside its handler it is off), so
# multi_head_attention_forward is caught itself, not the dropout it calls.
_PROBABILITY: dict[Any, tuple[str, int]] = {
    **dict.fromkeys([F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
                     torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
                     *_overloads(aten.dropout, aten.native_dropout, aten.feature_dropout, aten.alpha_dropout,
                                 aten.feature_alpha_dropout)], ("p", 1)),
    **dict.fromkeys([F.scaled_dot_product_attention, *_overloads(aten.scaled_dot_product_attention)], ("dropout_p", 4)),
    F.multi_head_attention_forward: ("dropout_p", 10),
}


class _NoDropout(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _PROBABILITY:
            name, index = _PROBABILITY[func]
            if name in kwargs or len(args) <= index:
                kwargs[name] = 0.0
            else:
                args = (*args[:index], 0.0, *args[index + 1:])
        return func(*args, **kwargs)


@contextmanager
def no_dropout() -> Iterator[None]:
    """Inside (this thread), every dropout runs with p = 0: the identity, in training mode too."""
    with _NoDropout():
        yield
