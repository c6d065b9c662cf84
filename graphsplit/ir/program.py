"""Program: what the passes produce and the backends consume.

A `Program` holds the plan, the traced whole graph and one `StageProgram` per pipeline stage (its
GraphModule, what crosses its boundaries, where its parameters come from, how they are sharded).
The graph is cut into those stages by `passes/stage_programs.py` (`build_program`), which reads the
stage annotations the passes wrote; this module only holds the data.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ..plan import Plan
from .batch import BatchDims
from .meta import TensorSpec, info
from .param_grads import params_without_grad
from .regions import StageRegion, fsdp_units
from .sharding import Layout, Replicate, Shard, expert_block, local_shape
from .traced_model import Traced, fill_leaves

if TYPE_CHECKING:
    from ..analysis.loss_reduction import TokenMeans


@dataclass
class Boundary:
    """The tensors sent from stage `index` to stage `index + 1`."""

    index: int
    values: list[str]
    specs: list[TensorSpec]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)


@dataclass
class StageProgram:
    """One pipeline stage: a GraphModule of tensors in, tensors out."""

    index: int
    gm: fx.GraphModule
    inputs: list[str]
    outputs: list[str]
    modules: list[str]
    first_node: str
    flops: int
    cost: float
    # stage-local parameter/buffer name -> the original model's (canonical) name
    param_sources: dict[str, str] = field(default_factory=dict)
    buffer_sources: dict[str, str] = field(default_factory=dict)
    # stage-local name -> value of a tensor the trace made itself, no part of the model (export's
    # lifted constants: a `torch.tensor(...)` in forward); the stage module holds it as a buffer
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    # its regions (CheckpointRegion children: blocks checkpointed or run plainly), the parameters each reads
    # and those its other ops read, by canonical name: what FSDP's units are chosen from (ir/regions.py)
    regions: tuple[StageRegion, ...] = ()
    read_outside_regions: frozenset[str] = frozenset()

    def input_examples(self) -> tuple[torch.Tensor, ...]:
        """Meta tensors shaped like this stage's inputs for one micro-batch (for measurements)."""
        return tuple(
            torch.empty(tuple(info(n).tensor.shape), dtype=info(n).tensor.dtype, device="meta")
            for n in self.gm.graph.nodes if n.op == "placeholder"
        )

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.gm.parameters())

    @property
    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.gm.parameters())


@dataclass
class Program:
    plan: Plan
    traced: Traced
    stages: list[StageProgram]
    boundaries: list[Boundary]
    # for each leaf of the model's output: ("tensor", i) = i-th output of the last stage,
    # or ("const", value)
    output_leaves: list[tuple[str, Any]]
    param_stages: dict[str, list[int]]
    # tensor parallel: canonical parameter name -> Shard (absent: replicated)
    param_shardings: dict[str, Shard] = field(default_factory=dict)
    replicated: list[dict[str, str]] = field(default_factory=list)
    # with tp and a cross-entropy loss: the loss as a graph over vocab-sharded logits, and
    # which output tensors stay sharded (index among the last stage's outputs -> Shard)
    loss_gm: fx.GraphModule | None = None
    sharded_outputs: dict[int, Shard] = field(default_factory=dict)
    # means over counted tokens normalized by the global count (passes/token_mean.py):
    # their count graphs, run on each step's batch (runtime/token_count.py)
    token_means: TokenMeans | None = None
    # where inputs, target and outputs hold the batch (analysis/batch/); None: dim 0 of each
    batch_dims: BatchDims | None = None
    # expert parallelism (passes/expert_parallel.py): each expert weight's canonical name -> its expert
    # dim, held in plan.ep slices over the expert-parallel ranks; and the layers placed
    expert_params: dict[str, int] = field(default_factory=dict)
    expert_layers: tuple[Any, ...] = ()
    # experts written as a loop over a list (passes/expert_loops.py): each slot weight the graph reads (by
    # expert j's name) -> the weight expert-parallel rank r holds there (expert r * E / ep + j's), by rank
    expert_slots: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # --fp8 (passes/float8.py): the nn.Linear modules, by the model's names, whose calls run in float8
    fp8_modules: tuple[str, ...] = ()

    @property
    def batch(self) -> BatchDims:
        if self.batch_dims is None:
            return BatchDims({n: 0 for n in self.traced.input_names}, size=1, how="dim 0")
        return self.batch_dims

    def param_sharding(self, canonical: str) -> Layout:
        return self.param_shardings.get(canonical, Replicate())

    def is_expert(self, canonical: str) -> bool:
        """Whether expert parallelism places this weight: each ep rank holds its own experts' (on a rank's
        program, `on_ep_rank`, a slot's weight goes by the name of the expert it holds)."""
        return canonical in self.expert_params or canonical in self._slot_weights

    @functools.cached_property
    def _slot_weights(self) -> frozenset[str]:
        return frozenset(n for held in self.expert_slots.values() for n in held)

    def on_ep_rank(self, ep_rank: int) -> Program:
        """This program as expert-parallel rank `ep_rank` runs it: each slot weight of a loop of experts
        under the name of the expert the rank holds there, so what reads names (materializing, checkpoints,
        gradients by name, the check) reads that expert's. The program itself where there are no slots."""
        if not self.expert_slots:
            return self
        held = {slot: names[ep_rank] for slot, names in self.expert_slots.items()}

        def rename(mapping: dict[str, Any]) -> dict[str, Any]:
            return {held.get(k, k): v for k, v in mapping.items()}
        stages = [dataclasses.replace(st, param_sources={local: held.get(c, c) for local, c in st.param_sources.items()},
                                      regions=tuple(dataclasses.replace(r, reads=frozenset(held.get(c, c) for c in r.reads))
                                                    for r in st.regions),
                                      read_outside_regions=frozenset(held.get(c, c) for c in st.read_outside_regions))
                  for st in self.stages]
        return dataclasses.replace(self, stages=stages, param_stages=rename(self.param_stages),
                                   param_shardings=rename(self.param_shardings))

    def expert_slice(self, canonical: str, value: torch.Tensor, ep_rank: int) -> torch.Tensor:
        """What expert-parallel rank `ep_rank` holds of `value` (an expert weight: its experts' slice
        of the expert dim; anything else whole)."""
        dim = self.expert_params.get(canonical)
        return value if dim is None else expert_block(value, dim, ep_rank, self.plan.ep)

    def fsdp_units(self, index: int) -> list[str]:
        """The regions of stage `index` FSDP shards as units of their own under this plan, by name (the
        rest of the stage is one more unit): the backend wraps them, the report lists them."""
        st = self.stages[index]
        return [r.name for r in fsdp_units(self.plan, st.regions, st.read_outside_regions)]

    def stage_param_bytes(self, index: int) -> int:
        """Bytes of parameters one rank of this stage holds (tied copies counted once)."""
        st = self.stages[index]
        seen: dict[str, int] = {}
        for local, canonical in st.param_sources.items():
            p = st.gm.get_parameter(local)
            shape = local_shape(tuple(p.shape), self.param_sharding(canonical), self.plan.tp)
            n = 1
            for x in shape:
                n *= x
            seen[canonical] = n * p.element_size()
        return sum(seen.values())

    @functools.cached_property
    def params_without_grad(self) -> frozenset[str]:
        """Canonical names no stage gives a gradient: frozen, or read only under no_grad."""
        free: dict[str, bool] = {}
        for st in self.stages:
            local_free = set(params_without_grad(st.gm))
            for local, canonical in st.param_sources.items():
                free[canonical] = free.get(canonical, True) and local in local_free
        return frozenset(c for c, f in free.items() if f)

    @functools.cached_property
    def shared_params(self) -> dict[str, list[int]]:
        """Canonical parameter names held by more than one stage (tied weights). Cached: the
        runtime asks once per parameter per step (`sync_tied_grads`)."""
        return {k: v for k, v in self.param_stages.items() if len(v) > 1}

    def unflatten_output(self, last_stage_output: Any) -> Any:
        outs = (last_stage_output,) if isinstance(last_stage_output, torch.Tensor) else tuple(last_stage_output)
        return self.traced.unflatten_output(fill_leaves(self.output_leaves, outs))

    def balance(self) -> float:
        costs = [s.cost for s in self.stages]
        mean = sum(costs) / len(costs)
        return max(costs) / mean if mean > 0 else 1.0
