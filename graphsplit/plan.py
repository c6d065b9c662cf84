"""`Plan`: what the user asks for, validated when it is built.

A Plan is a frozen dataclass: every field is checked in `__post_init__`, and
an invalid value fails at construction with a message naming the field.
`Plan.to_dict()` / `Plan.from_dict()` round-trip through JSON.

    >>> Plan(pp=2, microbatches=4).to_dict()["schedule"]
    '1f1b'
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import GraphsplitError

# Pipeline schedules by name -> torch.distributed.pipelining class name.
# All but gpipe and 1f1b hold several stages per rank. The zero-bubble ones split each backward
# into its input-gradient part (sent upstream at once) and its weight-gradient part (run later,
# in what would be a bubble): torch's stage does that with autograd on the stage's outputs.
SCHEDULES: dict[str, str] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "zero-bubble": "ScheduleInterleavedZeroBubble",  # ZB-1P, Qi et al. 2024 (arXiv 2401.10241)
    "zbv": "ScheduleZBVZeroBubble",  # ZB-V, same paper, sec. 6
    "dualpipev": "ScheduleDualPipeV",  # DeepSeek-V3's DualPipe folded into a V (arXiv 2412.19437)
}
MULTI_STAGE_SCHEDULES = frozenset({"interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv", "dualpipev"})
# V placement: pp rank r holds stages r and 2 * pp - 1 - r (exactly two), so the first and the last
# stage share rank 0 (torch's generate_stage_to_rank_mapping(style="v")).
V_SCHEDULES = frozenset({"zbv", "dualpipev"})
# Schedules that split backward into input and weight parts (torch runs them with autograd.grad,
# which DDP never sees: plain dp averages their gradients after the step, runtime/grad_average.py)
SPLIT_BACKWARD_SCHEDULES = frozenset({"zero-bubble", "zbv", "dualpipev"})
# graphsplit asks micro-batches divisible by pp of these (torch's rounds of pp micro-batches)
ROUND_SCHEDULES = frozenset({"interleaved-1f1b", "looped-bfs", "zero-bubble"})
# ...except where torch interleaves flexibly (the Llama 3 paper's change): max(1, m // pp) rounds of
# m / rounds micro-batches each, so any count the rounds divide (3 at pp 4, 6 at pp 4, not 5 at pp 2)
FLEX_SCHEDULES = frozenset({"interleaved-1f1b", "zero-bubble"})


def rounds_fit(schedule: str, pp: int, microbatches: int) -> bool:
    """Whether torch's `schedule` can run `microbatches` micro-batches over `pp` ranks."""
    if schedule in FLEX_SCHEDULES:
        return microbatches % max(1, microbatches // pp) == 0
    if schedule in ROUND_SCHEDULES:
        return microbatches % pp == 0
    return True
CHECKPOINT_POLICIES = ("none", "blocks", "stage", "selective", "attention")


@dataclass(frozen=True)
class CheckpointPolicy:
    """A checkpoint policy, parsed once: `kind` none, blocks, every (K blocks per region), first (the
    first N blocks of each stage), stage or selective (`selective:K`: one matmul output kept in K);
    `count` the K or N (1 otherwise)."""

    kind: str
    count: int = 1

    @property
    def by_blocks(self) -> bool:
        """Its regions are made of the model's repeated blocks."""
        return self.kind in ("blocks", "every", "first", "selective")


@functools.cache
def checkpoint_policy(text: str) -> CheckpointPolicy:
    """`text` ("every:2", "blocks", ...) as a policy; otherwise a GraphsplitError saying what is wrong
    (Plan names the field before it)."""
    kind, colon, count = str(text).partition(":")
    if kind in ("every", "first") or (kind == "selective" and colon):
        if not re.fullmatch(r"[1-9]\d*", count):
            what = {"every": "every:K takes K, the number of blocks per recomputed region",
                    "first": "first:N takes N, how many blocks of each stage are recomputed",
                    "selective": "selective:K takes K: each block keeps one matmul output in K (2: every other)"}[kind]
            raise GraphsplitError(f"{text!r}: {what}, a whole number of at least 1 (e.g. {kind}:"
                                  f"{1 if kind == 'first' else 2})")
        return CheckpointPolicy(kind, int(count))
    if text not in CHECKPOINT_POLICIES:
        raise GraphsplitError(f"unknown policy {text!r}; choose one of {', '.join(CHECKPOINT_POLICIES)}, "
                              "every:K, first:N or selective:K")
    return CheckpointPolicy(str(text))
# What a per-module override (Plan.checkpoint_overrides) does to the modules its glob matches:
# none: never checkpointed; full: one region, recomputed whole; selective: one region that
# keeps its matmul/attention outputs and recomputes the cheap ops around them.
CHECKPOINT_OVERRIDE_POLICIES = ("none", "full", "selective")
AUTOCAST_DTYPES = (None, "bf16", "fp16")
FP8_RECIPES = ("tensorwise", "rowwise")  # torchao's float8 training recipes (--fp8)


def _fail(field_name: str, message: str) -> GraphsplitError:
    return GraphsplitError(f"Plan.{field_name}: {message}")


def divisors(n: int) -> list[int]:
    """Every positive divisor of n, ascending (the counts a batch or a device count splits into)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]  # the planner asks this thousands of times
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Plan:
    """How to parallelize a model.

    pp: pipeline ranks. ep: expert-parallel ranks (whole experts per rank, drawn from dp). cp: context-parallel
    ranks (each sample's sequence cut across them, drawn from dp). sequence_parallel: Megatron's sequence parallelism on top of
    tp (norms, dropout and residual adds on 1/tp of the sequence). stages_per_rank: virtual stages each pp rank holds
    (2 or more needs an interleaved schedule). microbatches: how many pieces
    the batch is cut into (default: the number of stages). split_at: module
    names where a new stage starts (overrides the automatic cut).
    checkpoint: the activation-checkpoint policy for the whole model (none,
    blocks, every:K, first:N, stage, selective; see passes/activation_checkpoint.py).
    checkpoint_overrides: (glob, policy) pairs, e.g. (("h.0", "none"),
    ("h.1*", "selective")): modules whose path matches the glob (fnmatch) get
    the policy (none, full or selective) instead; the last matching pair wins.
    compile: each stage module runs under `torch.compile` (backends/compile_stages.py).
    """

    pp: int = 1
    tp: int = 1
    dp: int = 1
    fsdp: bool = False
    # DeepSpeed's stage. 1: plain dp (DDP) with the optimizer states sharded over the replicas (torch's
    # ZeroRedundancyOptimizer, Megatron's distributed optimizer). With fsdp: 3 (default) frees a block's
    # gathered parameters after its forward and gathers them again for its backward where there is no
    # pipeline; 2 keeps them gathered from the forward to the end of the backward (one all-gather a
    # step). Under a pipeline 2 and 3 both keep them.
    zero: int | None = None
    # expert parallelism: each mixture-of-experts layer's experts placed whole on ep ranks drawn
    # from the dp ranks (ep divides dp; each group of ep consecutive dp ranks exchanges tokens)
    ep: int = 1
    # context parallelism: one sample's sequence cut across cp ranks drawn from the dp ranks (cp
    # divides dp; each group of cp consecutive dp ranks holds the same samples, a load-balanced
    # shard of each sequence, and gathers keys and values at every attention call: ops/context_parallel.py)
    cp: int = 1
    sync_bn: bool = False  # BatchNorm statistics over all dp replicas (one all-reduce per layer)
    # Megatron's sequence parallelism: between a row-parallel output and the next column-parallel
    # input (norms, dropout, residual adds) activations are split over tp on the sequence dim
    sequence_parallel: bool = False
    # sequence parallelism's all-gathers and reduce-scatters run as rings of point-to-point steps, each
    # step's transfer overlapping the matmul of a chunk already held (torchtitan's async TP, Megatron's
    # --tp-comm-overlap): ops/async_tp.py
    async_tp: bool = False
    microbatches: int | None = None
    schedule: str = "1f1b"
    stages_per_rank: int = 1
    split_at: tuple[str, ...] = ()
    checkpoint: str = "none"
    checkpoint_overrides: tuple[tuple[str, str], ...] = ()
    autocast: str | None = None
    # torchao's float8 training recipe for the linears (tensorwise or rowwise scaling): passes/float8.py
    fp8: str | None = None
    seed: int = 0
    compile: bool = False
    # what a byte sent to the next pipeline stage weighs in the balanced cut, in FLOPs (the cost model's
    # unit: analysis/cost.py; None: its BYTES_TO_FLOPS, 8). `graphsplit plan` sets it from the hardware it
    # prices on, its matmul rate over the pp link's bandwidth (about 2,000 on H100s over NVLink, 20,000
    # across nodes), so the program it writes cuts where little is live on that machine
    send_flops_per_byte: float | None = None

    def __post_init__(self) -> None:
        for name in ("pp", "tp", "dp", "ep", "cp", "stages_per_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _fail(name, f"must be a positive integer, got {value!r}")
        if self.ep > 1 and self.dp % self.ep:
            raise _fail("ep", f"expert-parallel ranks are drawn from the data-parallel ones, so ep must divide dp; "
                              f"got ep={self.ep} with dp={self.dp}; give --dp {self.ep} (or a multiple of it)")
        if self.cp > 1 and self.dp % self.cp:
            raise _fail("cp", f"context-parallel ranks are drawn from the data-parallel ones, so cp must divide dp; "
                              f"got cp={self.cp} with dp={self.dp}; give --dp {self.cp} (or a multiple of it)")
        if self.cp > 1 and self.ep > 1:
            raise _fail("cp", "context and expert parallelism together are not supported yet; drop --cp or --ep")
        if self.zero is not None:
            if self.zero not in (1, 2, 3) or isinstance(self.zero, bool):
                raise _fail("zero", f"must be 1, 2 or 3 (DeepSpeed's stages), got {self.zero!r}")
            if self.zero == 1 and self.fsdp:
                raise _fail("zero", "ZeRO-1 keeps parameters and gradients whole on every replica (DDP) and shards "
                                    "the optimizer states alone; drop --fsdp, or give --zero 2 or 3")
            if self.zero == 1 and self.dp < 2:
                raise _fail("zero", f"ZeRO-1 shards the optimizer states over the data-parallel replicas but "
                                    f"dp={self.dp}; give --dp 2 or more")
            if self.zero == 1 and self.ep > 1:
                raise _fail("zero", "ZeRO-1 with expert parallelism is not supported (the replicas of a dp group hold "
                                    "other experts); drop --zero 1 or --ep")
            if self.zero > 1 and not self.fsdp:
                raise _fail("zero", f"ZeRO-{self.zero} shards over the dp replicas with FSDP2: set fsdp=True "
                                    "(--zero sets it), or drop zero")
        if self.fsdp and checkpoint_policy(self.checkpoint).kind == "attention":
            raise _fail("checkpoint", "attention's cores are too small to be FSDP's units, which are the blocks' "
                                      "regions; with --fsdp use selective or blocks")
        if self.send_flops_per_byte is not None and (
                isinstance(self.send_flops_per_byte, bool) or not isinstance(self.send_flops_per_byte, (int, float))
                or not math.isfinite(self.send_flops_per_byte) or self.send_flops_per_byte <= 0):
            raise _fail("send_flops_per_byte", f"must be a positive number of FLOPs, got {self.send_flops_per_byte!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise _fail("sequence_parallel", f"must be true or false, got {self.sequence_parallel!r}")
        if self.sequence_parallel and self.tp < 2:
            raise _fail("sequence_parallel", f"splits activations over the tensor-parallel ranks but tp={self.tp}; "
                                             "give tp=2 or more, or drop sequence parallelism")
        if not isinstance(self.async_tp, bool):
            raise _fail("async_tp", f"must be true or false, got {self.async_tp!r}")
        if self.async_tp and not self.sequence_parallel:
            raise _fail("async_tp", "overlaps sequence parallelism's all-gathers and reduce-scatters with the "
                                    "matmuls beside them; give --sequence-parallel (and --tp 2 or more) with it")
        if self.microbatches is not None and (
            not isinstance(self.microbatches, int) or self.microbatches < 1
        ):
            raise _fail("microbatches", f"must be a positive integer, got {self.microbatches!r}")
        if self.schedule not in SCHEDULES:
            raise _fail("schedule", f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        multi = self.schedule in MULTI_STAGE_SCHEDULES
        if self.stages_per_rank > 1 and not multi:
            raise _fail(
                "stages_per_rank",
                f"{self.stages_per_rank} stages per rank needs an interleaved schedule "
                f"(--schedule interleaved-1f1b), not {self.schedule!r}",
            )
        if multi and self.stages_per_rank < 2:
            raise _fail(
                "stages_per_rank",
                f"schedule {self.schedule!r} holds several stages per rank; set stages_per_rank >= 2",
            )
        if self.schedule in V_SCHEDULES and self.stages_per_rank != 2:
            raise _fail(
                "stages_per_rank",
                f"schedule {self.schedule!r} places exactly 2 stages on each rank (a V: rank r holds stages r "
                f"and {2 * self.pp - 1} - r); set stages_per_rank=2, not {self.stages_per_rank}",
            )
        if self.microbatches is not None and not rounds_fit(self.schedule, self.pp, self.microbatches):
            if self.schedule in FLEX_SCHEDULES:
                rounds = max(1, self.microbatches // self.pp)
                raise _fail(
                    "microbatches",
                    f"schedule {self.schedule!r} runs {rounds} rounds of micro-batches (microbatches // pp) and needs "
                    f"microbatches divisible by them, got {self.microbatches} at pp={self.pp}; give a multiple of "
                    f"{self.pp} or fewer than {2 * self.pp}",
                )
            raise _fail(
                "microbatches",
                f"schedule {self.schedule!r} needs microbatches divisible by pp={self.pp}, got {self.microbatches}",
            )
        if self.schedule == "dualpipev" and self.microbatches is not None and self.microbatches < self.num_stages:
            raise _fail(
                "microbatches",
                f"schedule 'dualpipev' needs at least one micro-batch per stage ({self.num_stages}), "
                f"got {self.microbatches}",
            )
        if isinstance(self.split_at, str) or not isinstance(self.split_at, (tuple, list)):
            raise _fail("split_at", f"must be a list of module names, got {self.split_at!r}")
        if not isinstance(self.split_at, tuple):
            object.__setattr__(self, "split_at", tuple(self.split_at))
        for name in self.split_at:
            if not isinstance(name, str) or not name.strip():
                raise _fail("split_at", f"{name!r} is not a module name; give names such as h.6 or layers.12")
        twice = sorted({name for name in self.split_at if self.split_at.count(name) > 1})
        if twice:
            raise _fail("split_at", f"{twice[0]!r} is given twice; each split point starts one new stage")
        if self.split_at and len(self.split_at) != self.num_stages - 1:
            given = len(self.split_at)
            fix = f"give {self.num_stages - 1} names" if self.num_stages > 1 else "give no split points"
            if (given + 1) % self.stages_per_rank == 0:
                fix += f", or pp={(given + 1) // self.stages_per_rank} for these {given}"
            raise _fail(
                "split_at",
                f"{given} split points make {given + 1} stages, but pp={self.pp} x "
                f"stages_per_rank={self.stages_per_rank} needs {self.num_stages - 1} split points; {fix}",
            )
        try:
            checkpoint_policy(self.checkpoint)
        except GraphsplitError as exc:
            raise _fail("checkpoint", str(exc)) from None
        object.__setattr__(self, "checkpoint_overrides", _overrides(self.checkpoint_overrides))
        if not isinstance(self.compile, bool):
            raise _fail("compile", f"must be true or false, got {self.compile!r}")
        if self.autocast not in AUTOCAST_DTYPES:
            raise _fail("autocast", f"unknown dtype {self.autocast!r}; choose bf16 or fp16")
        if self.fp8 not in (None, *FP8_RECIPES):
            raise _fail("fp8", f"unknown recipe {self.fp8!r}; choose {' or '.join(FP8_RECIPES)} (torchao's float8 scalings)")
        if self.fp8 is not None and self.autocast == "fp16":
            raise _fail("fp8", "float8 linears train with fp32 or bf16 around them (torchao's recipes); "
                               "use --autocast bf16 with --fp8")
        if self.schedule in SPLIT_BACKWARD_SCHEDULES and self.compile and self.fsdp and self.autocast and self.tp > 1:
            # found by run --check on the Llama example: in torch's weight backward a compiled piece's
            # backward (CompiledFunctionBackward, run again from its saved intermediates) returns no
            # gradient for a tp-sharded projection weight; each pair of these features runs. torch's
            # own issue: zero-bubble schedules fail on torch.compile'd models (pytorch/pytorch#161904)
            raise _fail("schedule", f"{self.schedule!r} under --compile with FSDP, {self.autocast} and tp "
                                    f"{self.tp} fails in torch's weight backward (pytorch/pytorch#161904, open); "
                                    "use interleaved-1f1b, or drop --compile")

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def sample_replicas(self) -> int:
        """How many ways the samples of a global batch are shared: dp, less the cp ranks that share samples
        (each cp group of dp ranks holds the same samples, a shard of every sequence)."""
        return self.dp // self.cp

    @property
    def num_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else self.num_stages

    @property
    def fsdp_reshards(self) -> bool:
        """FSDP frees each region's gathered parameters after its forward and gathers them again for its
        backward: ZeRO-3 with one stage (under a pipeline the units stay gathered between micro-batches,
        and ZeRO-2 keeps them gathered through the step)."""
        return self.block_regions and self.zero != 2

    @property
    def block_regions(self) -> bool:
        """Each block a region of its own even where nothing is checkpointed (run plainly as `block_N`):
        with one stage under per-region FSDP, so FSDP shards and gathers each block as a unit."""
        return self.fsdp_per_region and self.num_stages == 1

    @property
    def checkpoint_policy(self) -> CheckpointPolicy:
        return checkpoint_policy(self.checkpoint)

    @property
    def ddp(self) -> bool:
        """Plain dp runs under torch's DDP (backends/parallelize.py): not under FSDP, and not under a split
        backward, whose weight gradients (by `autograd.grad`) DDP never sees: plain dp averages them after
        the step there (runtime/grad_average.py)."""
        return self.dp > 1 and not self.fsdp and self.schedule not in SPLIT_BACKWARD_SCHEDULES

    @property
    def fsdp_per_region(self) -> bool:
        """FSDP shards each region of a stage (a block: checkpointed, or with one stage and no checkpointing
        run plainly) as a unit of its own, the rest of the stage as another (under --compile too: FSDP's
        hooks are dynamo-disabled, a graph break at each region); not under a split backward (its weight
        gradients by `autograd.grad`): one unit a stage there."""
        return self.fsdp and self.schedule not in SPLIT_BACKWARD_SCHEDULES

    def for_batch(self, share: int) -> Plan:
        """This plan with its micro-batches decided for a replica's batch of `share` samples, when it names
        none and the default (one per stage) does not divide that batch: the fewest counts that fill the
        pipeline among those dividing the batch (those its rounds divide for an interleaved schedule, `rounds_fit`); a batch
        too small for that gets as many as it has samples, under GPipe when the schedule was 1F1B
        (torch's 1F1B needs one micro-batch per stage; with fewer the two run the same order)."""
        if self.microbatches is not None or share < 1 or share % self.num_stages == 0:
            return self
        counts = [d for d in divisors(share) if rounds_fit(self.schedule, self.pp, d)]
        if not counts:
            return self  # the refusal names the problem
        filling = [d for d in counts if d >= self.num_stages]
        if filling:
            return self.replace(microbatches=filling[0])
        schedule = "gpipe" if self.schedule == "1f1b" else self.schedule
        return self.replace(microbatches=counts[-1], schedule=schedule)

    def stage_rank(self, stage: int) -> int:
        """The pp rank that holds `stage`: loop-style for interleaving (stage s on rank s % pp), a V
        for zbv and dualpipev (rank r holds stages r and 2 * pp - 1 - r)."""
        if self.schedule in V_SCHEDULES:
            return stage if stage < self.pp else 2 * self.pp - 1 - stage
        return stage % self.pp

    def stages_of_rank(self, pp_rank: int) -> list[int]:
        return [s for s in range(self.num_stages) if self.stage_rank(s) == pp_rank]

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["split_at"] = list(self.split_at)
        data["checkpoint_overrides"] = [list(pair) for pair in self.checkpoint_overrides]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise GraphsplitError(f"plan has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**{k: (tuple(v) if k == "split_at" else v) for k, v in data.items()})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan file: what `graphsplit plan --out` writes (the plan under "plan", the prediction beside
        it), or a bare plan object as `to_json()` writes it."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise GraphsplitError(f"cannot read plan file {path}: {exc}; give a file written by graphsplit plan --out") from None
        if isinstance(data, dict) and isinstance(data.get("plan"), dict):
            data = data["plan"]
        if not isinstance(data, dict):
            raise GraphsplitError(f"plan file {path} holds no plan object; give a file written by graphsplit plan --out")
        return cls.from_dict(data)


def _overrides(value: Any) -> tuple[tuple[str, str], ...]:
    """checkpoint_overrides as a tuple of (glob, policy); a mapping or lists (JSON) are accepted."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    if isinstance(pairs, str) or not isinstance(pairs, (tuple, list)):
        raise _fail("checkpoint_overrides", f"must be (glob, policy) pairs, got {value!r}")
    out = []
    for pair in pairs:
        if isinstance(pair, str) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise _fail("checkpoint_overrides", f"each entry must be a (glob, policy) pair, got {pair!r}")
        glob, policy = pair
        if not isinstance(glob, str) or not glob.strip() or "=" in glob:
            raise _fail("checkpoint_overrides", f"the glob must be a module-name pattern such as h.0 or h.*.mlp, got {glob!r}")
        if policy not in CHECKPOINT_OVERRIDE_POLICIES:
            raise _fail("checkpoint_overrides",
                        f"unknown policy {policy!r} for {glob!r}; choose one of {', '.join(CHECKPOINT_OVERRIDE_POLICIES)}")
        out.append((glob.strip(), policy))
    return tuple(out)

