"""Fast initialization: each rank draws only the parameter elements it holds, on its own device.

The exact mode (exact_init.py) runs the model's constructor and draws every random
number of the whole model on every rank: about 7.5 s per billion parameters on one
CPU thread. Here each parameter gets the distribution its module's own init gives
it, drawn tile by tile:

- a parameter is cut into fixed tiles over its first two dims (`TILE` x `TILE`,
  whole beyond; 1-D: `TILE` entries), a grid that depends on the parameter's
  shape only, never on the plan;
- each tile's values come from a generator seeded by (plan seed, parameter
  name, tile index), on the rank's device;
- a rank generates only the tiles its block overlaps (its tp shard, in
  its pp stages) and copies their elements it holds.

So element i of a parameter has one value whatever tp, pp or dp: a restart at
another plan without a checkpoint starts from the same model, and the whole
model at tp 1 is the reference `--check` compares against. The cost per rank
is the tiles it overlaps: its elements, plus the rest of tiles a shard edge
cuts (none when shard edges fall on multiples of `TILE`). Values differ from
the exact mode's (another random stream), and between CPU and CUDA generators.

Distributions (`rule_for`), by the module that holds the parameter:
- nn.Linear, nn.Conv*d: `reset_parameters`' kaiming_uniform(a=sqrt(5)), i.e.
  U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias;
- nn.Embedding: N(0, 1), the padding_idx row zero;
- torch's norms (LayerNorm, RMSNorm, GroupNorm, BatchNorm): weight ones, bias zeros;
- a Hugging Face model (a `config.initializer_range`): its `_init_weights`
  convention, N(0, initializer_range) for linear (Conv1D too) and embedding
  weights, zero biases, norms as above (GPT-2's extra 1/sqrt(2 n_layer) scaling
  of c_proj is not applied);
- any other module with its own `reset_parameters()`: that method run on an
  empty copy of just that module on the device, under a seed from (plan seed,
  module name), then this rank's block sliced out (cost: the module's whole
  parameters, not the model's);
- any other parameter of at most `SMALL` elements (a norm of the model's own, whose
  weight may be ones, or zeros as in Gemma's `x * (1 + weight)`; a learned scale): the
  value the constructor and its init code leave in it, from one run of the constructor
  with the larger parameters on meta (seeded by the plan's seed, the same on every rank);
- anything else (a large bare `nn.Parameter` filled by the constructor): no rule;
  `unsupported()` names it and `run --init auto` uses the exact mode.

Buffers (causal masks, RoPE tables, running statistics) come from the
constructor run with parameters on meta (`LoadedModel.build_buffers_only`).
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ..errors import GraphsplitError
from ..ir.sharding import Layout, Shard, expert_block, shard_tensor
from ..loader import seed_generators

if TYPE_CHECKING:
    from ..ir.program import StageProgram
    from ..loader import LoadedModel

TILE = 256  # rows and columns per tile: fixed, so a value never depends on the plan
# Parameters this small without a known rule take the constructor's own values: copied whole on
# every rank, a norm's weight even at width 65536 costs nothing beside the blocks drawn
SMALL = 1 << 16
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, nn.RMSNorm)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Rule:
    """How one parameter is drawn: kind uniform (-a, a), normal (mean a, std b), fill (a),
    module (its owner's own reset_parameters), or given (the constructor's own value)."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    zero_row: int | None = None  # an embedding's padding_idx
    module: str = ""  # kind "module": the owner's name


def _fan_in(weight: torch.Tensor) -> int:
    return weight.shape[1] * math.prod(weight.shape[2:]) if weight.dim() >= 2 else weight.shape[0]


def rule_for(owner: nn.Module, owner_name: str, leaf: str, param: nn.Parameter, hf_std: float | None) -> Rule | None:
    """The rule for parameter `leaf` of module `owner`, or None (no known init)."""
    if isinstance(owner, _NORMS):
        return Rule("fill", 1.0 if leaf == "weight" else 0.0)
    hf_linear = type(owner).__name__ == "Conv1D"  # HF GPT-2's transposed linear
    if hf_std is not None and (isinstance(owner, nn.Linear | nn.Embedding) or hf_linear):
        if leaf == "bias":
            return Rule("fill", 0.0)
        pad = owner.padding_idx if isinstance(owner, nn.Embedding) else None
        return Rule("normal", 0.0, hf_std, zero_row=pad)
    if isinstance(owner, (nn.Linear, *_CONVS)):
        bound = 1 / math.sqrt(_fan_in(owner.weight)) if _fan_in(owner.weight) > 0 else 0.0
        return Rule("uniform", bound)
    if isinstance(owner, nn.Embedding):
        return Rule("normal", 0.0, 1.0, zero_row=owner.padding_idx)
    if callable(getattr(owner, "reset_parameters", None)):
        return Rule("module", module=owner_name)
    if param.numel() <= SMALL:  # a norm of the model's own (ones, or Gemma's zeros), a learned scale
        return Rule("given")
    return None


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# an expert weight under expert parallelism: (its expert dim, this rank's place in the ep group, ep)
Experts = tuple[int, int, int]


def _held(n: int, layout: Layout | None, dim: int, tp_rank: int, tp: int, experts: Experts | None = None
          ) -> torch.Tensor:
    """For each local index along `dim`, the full index it holds (-1: a padding row)."""
    whole = torch.arange(1, n + 1)
    if isinstance(layout, Shard) and layout.dim == dim and tp > 1:
        whole = shard_tensor(whole, Shard(0, layout.chunks, layout.size), tp_rank, tp)
    if experts is not None and experts[0] == dim:
        whole = expert_block(whole, 0, experts[1], experts[2])
    return whole - 1


def _local(value: torch.Tensor, layout: Layout | None, tp_rank: int, tp: int, experts: Experts | None) -> torch.Tensor:
    """This rank's block of a whole value: its tp shard, then its experts' slice."""
    if layout is not None:
        value = shard_tensor(value, layout, tp_rank, tp)
    if experts is not None:
        value = expert_block(value, *experts)
    return value


def _groups(held: torch.Tensor, tile: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(tile index, local positions, offsets inside the tile) for each tile `held` touches."""
    real = held >= 0
    which = torch.where(real, held // tile, -1)
    out = []
    for t in torch.unique(which[real]).tolist():
        local = torch.nonzero(which == t).flatten()
        out.append((t, local, held[local] - t * tile))
    return out


class FastInit:
    """The tensors source for fast initialization: fills a stage's parameters block by block.

    `drawn` counts the random elements generated (tests assert it scales with what a rank holds)."""

    def __init__(self, rules: Mapping[str, Rule], meta_model: nn.Module, buffers: Mapping[str, torch.Tensor],
                 seed: int, given: Mapping[str, torch.Tensor] | None = None) -> None:
        self.rules = dict(rules)
        self.meta_model = meta_model
        self.buffers = dict(buffers)
        self.given = dict(given or {})  # rule "given": the constructor's own values
        self.seed = seed
        self.drawn = 0

    @classmethod
    def for_model(cls, loaded: LoadedModel, seed: int) -> FastInit:
        """Rules from the model built on meta; buffers from its constructor (parameters on meta).
        Raises GraphsplitError naming a parameter no rule covers."""
        meta = loaded.build("meta")
        rules = model_rules(meta)
        missing = unsupported(meta, rules)
        if missing:
            raise GraphsplitError(f"--init fast: no init rule for parameter {missing[0]!r} "
                                  f"({len(missing)} in all): use --init exact")
        with torch.random.fork_rng(devices=[]):  # the same constructor values on every rank, whatever ran before
            seed_generators(seed)
            shell = loaded.build_buffers_only(keep_up_to=SMALL)
        buffers = dict(shell.named_buffers(remove_duplicate=False))
        given = {n: p.detach() for n, p in shell.named_parameters(remove_duplicate=False)
                 if rules.get(n) == Rule("given") and p.device.type != "meta"}
        lost = [n for n, r in rules.items() if r == Rule("given") and n not in given]
        if lost:
            raise GraphsplitError(f"--init fast: the constructor leaves parameter {lost[0]!r} on meta, so it has "
                                  "no value to start from; use --init exact")
        return cls(rules, meta, buffers, seed, given)

    def fill(self, target: torch.Tensor, name: str, layout: Layout | None, tp_rank: int, tp: int,
             experts: Experts | None = None) -> None:
        """Write parameter `name`'s elements this rank holds into `target` (its local block; `experts`: an
        expert weight's (dim, ep rank, ep), of which the rank holds one slice)."""
        rule = self.rules[name]
        full_shape = tuple(self.meta_model.get_parameter(name).shape)
        if not full_shape:  # a scalar parameter: one element, drawn as a vector of one
            target, full_shape = target.view(1), (1,)
        with torch.no_grad():
            if rule.kind == "module":
                target.copy_(_local(self._by_module(name, rule, target.device), layout, tp_rank, tp, experts))
                return
            if rule.kind == "given":
                value = self.given[name].to(target.device, target.dtype).view(full_shape)
                target.copy_(_local(value, layout, tp_rank, tp, experts).reshape(target.shape))
                return
            target.zero_()  # padding rows stay zero
            if rule.kind == "fill":
                target[(_held(full_shape[0], layout, 0, tp_rank, tp, experts) >= 0).to(target.device)] = rule.a
                return
            self._draw(target, name, rule, full_shape, layout, tp_rank, tp, experts)

    def _draw(self, target: torch.Tensor, name: str, rule: Rule, full_shape: tuple[int, ...], layout: Layout | None,
              tp_rank: int, tp: int, experts: Experts | None = None) -> None:
        device = target.device
        two_d = len(full_shape) >= 2
        rows = _groups(_held(full_shape[0], layout, 0, tp_rank, tp, experts), TILE)
        cols = _groups(_held(full_shape[1], layout, 1, tp_rank, tp, experts), TILE) if two_d else [(0, None, None)]
        generator = torch.Generator(device=device)
        for r, r_local, r_off in rows:
            for c, c_local, c_off in cols:
                shape = list(full_shape)
                shape[0] = min(TILE, full_shape[0] - r * TILE)
                if two_d:
                    shape[1] = min(TILE, full_shape[1] - c * TILE)
                generator.manual_seed(_seed(self.seed, name, r, c))
                tile = torch.empty(shape, dtype=target.dtype, device=device)
                if rule.kind == "uniform":
                    tile.uniform_(-rule.a, rule.a, generator=generator)
                else:
                    tile.normal_(rule.a, rule.b, generator=generator)
                self.drawn += tile.numel()
                if rule.zero_row is not None and r * TILE <= rule.zero_row < r * TILE + shape[0]:
                    tile[rule.zero_row - r * TILE] = 0
                block = tile.index_select(0, r_off.to(device))
                index: tuple[torch.Tensor, ...] = (r_local.to(device),)
                if two_d:
                    assert c_local is not None and c_off is not None
                    block = block.index_select(1, c_off.to(device))
                    index = (r_local.to(device)[:, None], c_local.to(device)[None, :])
                target.index_put_(index, block)

    def _by_module(self, name: str, rule: Rule, device: torch.device) -> torch.Tensor:
        """The owner's own reset_parameters() on an empty copy of just that module, seeded by its name."""
        owner = copy.deepcopy(self.meta_model.get_submodule(rule.module)).to_empty(device=device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(_seed(self.seed, rule.module))
            owner.reset_parameters()  # type: ignore[operator]
        self.drawn += sum(p.numel() for p in owner.parameters())
        leaf = name.removeprefix(rule.module + ".") if rule.module else name
        return owner.get_parameter(leaf).detach()

    def fill_stage(self, module: nn.Module, stage: StageProgram, shardings: Mapping[str, Layout], tp_rank: int,
                   tp: int, experts: Mapping[str, int] | None = None, ep_rank: int = 0, ep: int = 1) -> None:
        """Every parameter and buffer of one materialized (empty) stage module (`experts`: the expert
        weights' expert dims, held in ep slices)."""
        done: set[str] = set()
        experts = experts or {}
        with torch.no_grad():
            for local, canonical in stage.param_sources.items():
                if canonical not in done:  # a tied alias is made one tensor again afterwards
                    held = (experts[canonical], ep_rank, ep) if canonical in experts else None
                    self.fill(module.get_parameter(local), canonical, shardings.get(canonical), tp_rank, tp, held)
                    done.add(canonical)
            for local, canonical in stage.buffer_sources.items():
                module.get_buffer(local).copy_(self.buffers[canonical])


def model_rules(model: nn.Module) -> dict[str, Rule]:
    """A rule for each parameter (first name of a tied one) of `model` that has one."""
    config = getattr(model, "config", None)
    hf_std = getattr(config, "initializer_range", None) if hasattr(model, "_init_weights") else None
    rules: dict[str, Rule] = {}
    for owner_name, owner in model.named_modules():
        for leaf, param in owner.named_parameters(recurse=False):
            name = f"{owner_name}.{leaf}" if owner_name else leaf
            rule = rule_for(owner, owner_name, leaf, param, hf_std)
            if rule is not None:
                rules[name] = rule
    first = {id(p): n for n, p in model.named_parameters()}
    # a tied parameter's rule is that of its first name
    return {n: rules[n] for n in first.values() if n in rules} | {
        n: rules[first[id(p)]] for n, p in model.named_parameters(remove_duplicate=False)
        if first[id(p)] in rules}


def unsupported(model: nn.Module, rules: Mapping[str, Rule]) -> list[str]:
    """Parameters of `model` no rule covers (fast init cannot give them a value)."""
    return [n for n, _ in model.named_parameters() if n not in rules]


def fast_model(loaded: LoadedModel, seed: int, device: str | torch.device = "cpu") -> nn.Module:
    """The whole model with fast init's values (what every plan's shards are slices of)."""
    source = FastInit.for_model(loaded, seed)
    model = loaded.build("meta")
    first = {id(p): n for n, p in model.named_parameters()}
    aliases = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != n}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            source.fill(param, name, None, 0, 1)
        for name, buffer in model.named_buffers():
            buffer.copy_(source.buffers[name])
    for alias, name in aliases.items():  # to_empty gave each alias of a tied parameter its own tensor
        owner, _, leaf = alias.rpartition(".")
        model.get_submodule(owner)._parameters[leaf] = model.get_parameter(name)
    return model
