"""The planner on published training runs it was not tuned on: each run's published layout priced on its
hardware, its throughput beside the published one (docs/figures.md, "The planner on published runs").

    python bench/published_runs.py                    # every run: a table, the ratios and their geometric mean
    python bench/published_runs.py --system torchtitan --markdown

Each run names its source (file and table), its model's shape (built on meta from the GPT or Llama example
at that configuration: no weights exist), its hardware (a profile; where the publication's GPUs are another
part, a `Site`: the profile with the memory, bandwidth and peak it states, a stated range of peak priced at
its middle and at each end), the layout it published and its throughput. What a publication leaves open
(micro-batch size, schedule, checkpointing) is taken as the fastest choice that fits in memory; what it
states is fixed. A ratio above 1 is the planner predicting faster than the run was.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench" / "models"))

from llama import build_model as build_llama  # noqa: E402
from megatron_gpt import build_model as build_gpt  # noqa: E402

from graphsplit import Plan  # noqa: E402
from graphsplit.loader import LoadedModel  # noqa: E402
from graphsplit.plan import MULTI_STAGE_SCHEDULES, rounds_fit  # noqa: E402
from graphsplit.planner import load_hardware  # noqa: E402
from graphsplit.planner.estimate import Estimate  # noqa: E402
from graphsplit.planner.hardware import Hardware  # noqa: E402
from graphsplit.planner.links import send_flops_per_byte  # noqa: E402
from graphsplit.planner.price import price_plan  # noqa: E402
from graphsplit.planner.profile import ModelProfile, build_all_tables, profile_model  # noqa: E402


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def _hf_cross_entropy(output: Any, target: torch.Tensor) -> torch.Tensor:
    return _cross_entropy(output.logits, target)


def _build_bloom(n_layer: int, hidden_size: int, n_head: int, vocab_size: int) -> torch.nn.Module:
    """HF transformers' BloomForCausalLM as is (BLOOM's code as Megatron-DeepSpeed trained it, ported): ALiBi
    added to the scores by `baddbmm`, softmax, `bmm` (no flash attention), an embedding LayerNorm, a GeLU
    written as a custom autograd Function, the head tied to the embedding."""
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(n_layer=n_layer, hidden_size=hidden_size, n_head=n_head, vocab_size=vocab_size,
                         attention_dropout=0.0, hidden_dropout=0.0, use_cache=False)
    return BloomForCausalLM(config)


@dataclass(frozen=True)
class Shape:
    """A model's shape: Megatron's GPT (bench/models/megatron_gpt.py: LayerNorm, GeLU MLP of 4 x the width,
    flash attention, tied head), the Llama example (RMSNorm, SwiGLU, RoPE, grouped-query attention, flash
    attention) or HF's BLOOM (`_build_bloom`) at a configuration."""

    family: str  # "gpt" | "llama" | "bloom"
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    kv_heads: int | None = None  # llama
    ffn: int | None = None  # llama's SwiGLU width

    def config(self) -> dict[str, Any]:
        if self.family == "gpt":
            return dict(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab, seq=self.seq)
        if self.family == "bloom":
            return dict(n_layer=self.layers, hidden_size=self.hidden, n_head=self.heads, vocab_size=self.vocab)
        return dict(n_layers=self.layers, dim=self.hidden, n_heads=self.heads, n_kv_heads=self.kv_heads,
                    hidden=self.ffn, vocab_size=self.vocab, max_seq_len=self.seq)

    def loaded(self, batch: int) -> LoadedModel:
        if self.family == "bloom":
            from transformers.models.bloom import modeling_bloom

            build, path, loss = _build_bloom, Path(modeling_bloom.__file__), _hf_cross_entropy
        else:
            build, path = (build_gpt, ROOT / "bench/models/megatron_gpt.py") if self.family == "gpt" else \
                (build_llama, ROOT / "examples/llama.py")
            loss = _cross_entropy
        tokens = torch.zeros(batch, self.seq, dtype=torch.long)
        config = self.config()
        return LoadedModel(path, "build_model", lambda: build(**config), (tokens,), {}, loss, tokens)

    def megatron_flops_per_token(self) -> float:
        """Megatron-LM's model FLOPs of one token's training step (megatron/training/training.py,
        `num_floating_point_operations`, MLP 4 x the width, no GQA): 72 l h^2 (1 + s / 6h + V / 12lh)."""
        h, s, v, lay = self.hidden, self.seq, self.vocab, self.layers
        return 72 * lay * h * h * (1 + s / (6 * h) + v / (12 * lay * h))


LLAMA31_8B = Shape("llama", 32, 4096, 32, 128256, 8192, kv_heads=8, ffn=14336)
LLAMA31_70B = Shape("llama", 80, 8192, 64, 128256, 8192, kv_heads=8, ffn=28672)
LLAMA3_405B = Shape("llama", 126, 16384, 128, 128256, 8192, kv_heads=8, ffn=53248)


def _megatron(heads: int, hidden: int, layers: int) -> Shape:
    return Shape("gpt", layers, hidden, heads, 131072, 4096)


@dataclass(frozen=True)
class Site:
    """A run's GPUs where they are not the profile's part, as its publication states them: their memory,
    its bandwidth, and the bf16 peak as the range it gives where it states only bounds (priced at the
    middle, the prediction at each bound printed beside). Every rate of the profile scales with the peak
    (one clock drives the tensor and the vector units)."""

    label: str
    memory_bytes: int
    memory_bandwidth: float
    bf16_peak: tuple[float, float]  # (low, high) FLOP/s

    def hardware(self, base: Hardware, peak: float | None = None) -> Hardware:
        peak = sum(self.bf16_peak) / 2 if peak is None else peak
        scale = peak / base.peak_flops["bfloat16"]
        # the name keys the planner's cached op times: one name per variant
        return dataclasses.replace(base, name=f"{base.name}, {self.label} at {peak / 1e12:.0f} TFLOP/s bf16",
                                   memory_bytes=self.memory_bytes, memory_bandwidth=self.memory_bandwidth,
                                   peak_flops={k: v * scale for k, v in base.peak_flops.items()})


@dataclass(frozen=True)
class Run:
    """One published training run and the unit its throughput was published in."""

    system: str
    name: str
    source: str
    shape: Shape
    hardware: str
    batch: int  # global batch, sequences
    layout: Plan  # the published layout; micro-batches set from `micro_batch` when published
    published: float
    unit: str  # "tokens/s/GPU" | "TFLOP/s/GPU (Megatron)" | "TFLOP/s/GPU (model)" | "s/step"
    micro_batch: int | None = None  # sequences a micro-batch, when published
    open: tuple[str, ...] = ("micro_batch", "schedule", "checkpoint")  # what the publication leaves open
    note: str = ""
    checkpoints: tuple[str, ...] = ("none", "selective", "blocks")
    site: Site | None = None  # the run's GPUs where they are not the profile's part
    memory_gib: float | None = None  # the peak memory per GPU it published

    @property
    def gpus(self) -> int:
        return self.layout.world_size


MEGATRON_SRC = "NVIDIA/Megatron-LM README.md, Performance Benchmarking (images/model_table.png, 2024-07-15)"
MEGATRON_NOTE = "bf16; vocab 131,072, 4,096 tokens; --overlap-grad-reduce/-param-gather, --tp-comm-overlap"


def _megatron_runs() -> Iterator[Run]:
    rows = [("1.7B", 16, 2048, 24, 1, 1, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 192, 465.9),
            ("16B", 48, 6144, 32, 4, 1, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 192, 459.6),
            ("70B", 64, 8192, 84, 8, 2, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 768, 420.5),
            ("177B", 96, 12288, 96, 8, 6, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 1536, 474.4),
            ("462B", 144, 18432, 112, 8, 16, 3072, 459.9)]
    for name, heads, hidden, layers, tp, pp, batch, tflops in rows:
        # Megatron's distributed optimizer over the 48 replicas with its dp overlap (the README's benchmark
        # configuration: --overlap-grad-reduce, --overlap-param-gather): gradients reduce-scattered during the
        # backward, parameters all-gathered during the next forward. graphsplit's program that communicates so
        # is --zero 2 (FSDP2 gathering a unit's parameters ahead of its forward, keeping them to its backward,
        # reduce-scattering its gradients there); its --zero 1 (DDP, then ZeroRedundancyOptimizer's broadcast
        # after the step) exposes that broadcast, which Megatron does not. Sequence parallelism with tp;
        # Megatron's fused kernels (Transformer Engine's LayerNorm and GeLU, fused bias and softmax) priced as
        # torch.compile's fusion of the same elementwise ops
        # --tp-comm-overlap (its configuration's): graphsplit's program that overlaps so is --async-tp
        layout = Plan(tp=tp, pp=pp, dp=48, fsdp=True, zero=2, sequence_parallel=tp > 1, async_tp=tp > 1,
                      autocast="bf16", compile=True)
        yield Run("Megatron-LM", f"GPT {name}", MEGATRON_SRC, _megatron(heads, hidden, layers), "h100", batch,
                  layout, tflops, "TFLOP/s/GPU (Megatron)", note=MEGATRON_NOTE)


TITAN_SRC = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TITAN_TP_SRC = "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
TITAN_H200_SRC = "pytorch/torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md (Trainy)"
# torchtitan's H100s (both files, "Hardware"): 96 GB of HBM2e at 2.4 TB/s, the 500 W default power limit, and
# (its footnote 2) "the actual peak TFLOPs number is between SXM and NVL": 835 TFLOP/s dense bf16 for the
# H100 NVL (NVIDIA's H100 datasheet: 1,671 with sparsity) to the SXM5's 989.4
TITAN_H100 = Site("96 GB HBM2e at 500 W", 96 * 10**9, 2.4e12, (835.5e12, 989.4e12))
TITAN_NOTE = "H100 96GB HBM2e at 500 W (Grand Teton): 2.4 TB/s, bf16 peak between the NVL's and the SXM5's"


def _torchtitan_runs() -> Iterator[Run]:
    for table, gpus, eager, compiled, fp8 in (("Table 1", 8, (5762, 82.4), (6667, 77.0), (8532, 76.8)),
                                              ("Table 3", 128, (5605, 67.0), (6514, 62.0), (8380, 61.8))):
        for label, compile_, fp8_, (tps, gib) in (("", False, None, eager), (" compiled", True, None, compiled),
                                                  (" compiled, Float8", True, "tensorwise", fp8)):
            yield Run("torchtitan", f"Llama 3.1 8B FSDP{label}", f"{TITAN_SRC}, {table}", LLAMA31_8B, "h100",
                      2 * gpus, Plan(dp=gpus, fsdp=True, autocast="bf16", compile=compile_, checkpoint="selective:2",
                                     fp8=fp8_),
                      tps, "tokens/s/GPU", micro_batch=2, open=(), note=TITAN_NOTE + "; selective op AC",
                      site=TITAN_H100, memory_gib=gib)
    # its async-TP benchmark: vanilla and async TP, bf16 and float8 (tensorwise, rowwise). The float8 rowwise
    # async rows (624.8 and 3,914.9) are not priced: graphsplit's --async-tp rings tensorwise float8 gathers
    # (ops/float8_ring.py) and leaves rowwise ones plain, so no program of graphsplit's runs them
    for model, shape, gpus, dp, local, policy, note, rows in (
            ("70B", LLAMA31_70B, 256, 32, 16, "blocks", "full AC",
             ((None, False, 597.3), (None, True, 652.4), ("tensorwise", False, 809.8), ("tensorwise", True, 942.4),
              ("rowwise", False, 599.6))),
            ("8B", LLAMA31_8B, 64, 8, 12, "selective:2", "per-op SAC",
             ((None, False, 4378), (None, True, 4809.4), ("tensorwise", False, 5078.1), ("tensorwise", True, 5570.1),
              ("rowwise", False, 3708.5)))):
        for fp8, async_tp, tps in rows:
            label = f"Llama 3.1 {model} FSDP{dp} x TP8{', async TP' if async_tp else ''}{f', Float8 {fp8}' if fp8 else ''}"
            kind = f"{'float8 ' + fp8 if fp8 else 'bf16'} {'async' if async_tp else 'vanilla'} TP"
            yield Run("torchtitan", label, f"{TITAN_TP_SRC}, {model} on {gpus} H100s, {kind}", shape, "h100",
                      local * dp, Plan(dp=dp, tp=8, fsdp=True, sequence_parallel=True, async_tp=async_tp,
                                       autocast="bf16", compile=True, checkpoint=policy, fp8=fp8),
                      tps, "tokens/s/GPU", micro_batch=local, open=(), site=TITAN_H100,
                      note=TITAN_NOTE + f"; {note}" + ("; vanilla float8 rowwise TP slow (torchtitan #1207)"
                                                       if fp8 == "rowwise" else ""))
    # the H200s the planner's profile was measured on: llama3_8b.toml (8,192 tokens, per-op SAC) with
    # --training.local_batch_size=2 --training.compile --model.converters=float8 (tensorwise, the output layer
    # left in bf16) and FSDP gathering the float8 weights (graphsplit's FSDP gathers them in bf16)
    for nodes, tps, gib in ((4, 10938, 47.96), (8, 10753, 46.97)):
        gpus = 8 * nodes
        yield Run("torchtitan", f"Llama 3.1 8B FSDP compiled, Float8, {gpus} H200s", TITAN_H200_SRC, LLAMA31_8B,
                  "h200", 2 * gpus, Plan(dp=gpus, fsdp=True, autocast="bf16", compile=True, checkpoint="selective:2",
                                          fp8="tensorwise"),
                  tps, "tokens/s/GPU", micro_batch=2, open=(), note="H200 SXM; float8 all-gather in FSDP",
                  memory_gib=gib)


LLAMA3_SRC = "The Llama 3 Herd of Models (arXiv 2407.21783), Table 4"


def _llama3_runs() -> Iterator[Run]:
    for gpus, dp, mb, tflops in ((8192, 64, 32, 430), (16384, 128, 16, 400)):
        yield Run("Llama 3 (Meta)", f"Llama 3 405B, {gpus:,} GPUs", LLAMA3_SRC, LLAMA3_405B, "h100", 2048,
                  Plan(tp=8, pp=16, dp=dp, microbatches=mb, autocast="bf16", sequence_parallel=True),
                  tflops, "TFLOP/s/GPU (model)", open=("schedule", "checkpoint", "fsdp", "compile", "async_tp"),
                  checkpoints=("none", "selective", "first:1", "first:2", "blocks"),
                  note="BF16 MFU 38-43%; the schedule's knobs, FSDP, fused kernels and tp overlap not published")


BRIDGE_SRC = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md"
# its performance recipes train with Megatron's distributed optimizer (recipes/utils/optimizer_utils.py,
# distributed_fused_adam_with_cosine_annealing: use_distributed_optimizer=True) and overlap the dp traffic
# (training/comm_overlap.py): graphsplit's program that communicates so is --zero 2, as for Megatron-LM above
BRIDGE_NOTE = "FP8 current scaling (tensorwise); distributed optimizer; tp comm overlap"
# and overlap the tp collectives with the GEMMs (its H100 recipes set userbuffers' tp_comm_overlap_cfg,
# scripts/performance/configs/llama/llama3_llm_pretrain.py): graphsplit's program that does is --async-tp,
# its float8 gathers rings of float8 chunks (ops/float8_ring.py)
# the recipes recompute nothing (perf_recipes/llama/h100/llama3.py sets no recompute_granularity), which
# graphsplit's program, keeping more per layer than Megatron's (its norms and residual stream in fp32 as
# autocast runs them, TE's fused norm-linears keeping float8 inputs), does not fit: the least recompute
# that fits is taken, a block of each stage's (first:1) among them
BRIDGE_CHECKPOINTS = ("none", "selective", "first:1", "blocks")


def _bridge_runs() -> Iterator[Run]:
    yield Run("Megatron-Bridge (NeMo)", "Llama 3 70B FP8", f"{BRIDGE_SRC}, LLAMA3_70B, DGX-H100, 26.04.01",
              LLAMA31_70B, "h100", 256,
              Plan(tp=4, pp=8, dp=2, fsdp=True, zero=2, sequence_parallel=True, async_tp=True, schedule="interleaved-1f1b",
                   stages_per_rank=5, autocast="bf16", fp8="tensorwise", compile=True),
              1664, "tokens/s/GPU", micro_batch=1, open=("checkpoint",), checkpoints=BRIDGE_CHECKPOINTS,
              note=BRIDGE_NOTE + ", VP 5")
    yield Run("Megatron-Bridge (NeMo)", "Llama 3.1 405B FP8", f"{BRIDGE_SRC}, LLAMA3.1_405B, DGX-H100, 26.04.01",
              LLAMA3_405B, "h100", 1536,
              Plan(tp=8, pp=8, cp=2, dp=16, fsdp=True, zero=2, sequence_parallel=True, async_tp=True,
                   schedule="interleaved-1f1b",
                   stages_per_rank=8, autocast="bf16", fp8="tensorwise", compile=True),
              328, "tokens/s/GPU", micro_batch=1, open=("checkpoint",), checkpoints=BRIDGE_CHECKPOINTS,
              note=BRIDGE_NOTE + ", CP 2, VP 8")
    # Megatron FSDP (its table's FSDP column) over one node, 16 micro-batches of one sequence a step
    yield Run("Megatron-Bridge (NeMo)", "Llama 3 8B FP8 FSDP", f"{BRIDGE_SRC}, 25.11 container, DGX-H100, LLAMA3_8B",
              LLAMA31_8B, "h100", 128, Plan(dp=8, fsdp=True, autocast="bf16", fp8="tensorwise", compile=True),
              14451, "tokens/s/GPU", micro_batch=1, open=("checkpoint",), note="FP8 current scaling; Megatron FSDP")


BLOOM_SRC = "bigscience-workshop/bigscience train/tr11-176B-ml/README.md (iteration 85376 log line)"


def _bloom_runs() -> Iterator[Run]:
    # HF's BLOOM, the model as trained: its attention written out (baddbmm with ALiBi, softmax, bmm: BLOOM
    # trained without flash attention), Megatron-DeepSpeed's fused kernels (scale-mask-softmax, bias-GeLU,
    # LayerNorm) priced as torch.compile's fusion of the same ops
    yield Run("Megatron-DeepSpeed (BLOOM)", "BLOOM 176B", BLOOM_SRC, Shape("bloom", 70, 14336, 112, 250880, 2048),
              "a100", 2048, Plan(tp=4, pp=12, dp=8, zero=1, autocast="bf16", checkpoint="blocks", compile=True),
              104.70, "s/step", micro_batch=2, open=(), note="A100 80GB, ZeRO-1, full recompute, fused kernels; "
              "HF's BloomForCausalLM (ALiBi, attention written out)")


RUNS: list[Run] = [*_megatron_runs(), *_torchtitan_runs(), *_llama3_runs(), *_bridge_runs(), *_bloom_runs()]


@dataclass
class Result:
    run: Run
    estimate: Estimate | None
    fits: bool
    predicted: float = math.nan
    seconds: float = 0.0
    chosen: dict[str, Any] = field(default_factory=dict)
    bounds: tuple[float, ...] | None = None  # predicted at each end of a site's stated peak

    @property
    def ratio(self) -> float:
        return self.predicted / self.run.published if self.run.unit != "s/step" else self.run.published / self.predicted


def _candidates(run: Run, hw: Hardware) -> Iterator[Plan]:
    base = run.layout
    # graphsplit's program as the planner configures it on this hardware: its cut weighs a byte sent so
    send = send_flops_per_byte(hw, base.tp, base.autocast is not None) if base.pp > 1 else None
    replicas = base.dp // base.cp
    sizes = (run.micro_batch,) if run.micro_batch else (1, 2, 4)
    schedules = ((base.schedule, base.stages_per_rank),) if "schedule" not in run.open or base.pp == 1 else \
        (("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4), ("interleaved-1f1b", 8))
    checkpoints = run.checkpoints if "checkpoint" in run.open else (base.checkpoint,)
    fsdps = (False, True) if "fsdp" in run.open else (base.fsdp,)
    compiles = (False, True) if "compile" in run.open else (base.compile,)
    rings = (False, True) if "async_tp" in run.open and base.sequence_parallel else (base.async_tp,)
    for size, (schedule, v), checkpoint, fsdp, compiled, ring in itertools.product(sizes, schedules, checkpoints,
                                                                                   fsdps, compiles, rings):
        per_replica = run.batch // replicas
        count = base.microbatches if base.microbatches and "micro_batch" not in run.open and not run.micro_batch \
            else per_replica // size
        if count < 1 or per_replica % size:
            continue
        if schedule in MULTI_STAGE_SCHEDULES and not rounds_fit(schedule, base.pp, count):
            continue
        yield base.replace(microbatches=count, schedule=schedule, stages_per_rank=v, checkpoint=checkpoint, fsdp=fsdp,
                           compile=compiled, async_tp=ring, send_flops_per_byte=send)


def _throughput(run: Run, est: Estimate, peak: float) -> float:
    """The estimate in the run's published unit."""
    per_gpu = (est.tokens_per_second or 0.0) / run.gpus
    if run.unit == "tokens/s/GPU":
        return per_gpu
    if run.unit == "TFLOP/s/GPU (Megatron)":
        return per_gpu * run.shape.megatron_flops_per_token() / 1e12
    if run.unit == "TFLOP/s/GPU (model)":
        return est.mfu * peak / 1e12
    return est.step_seconds  # s/step


def _profile(run: Run, hw: Hardware, cache: dict[Any, ModelProfile]) -> ModelProfile:
    key = (run.shape, run.batch, hw.fused_attention)
    if key not in cache:
        profile = profile_model(run.shape.loaded(run.batch), (run.layout.tp,), hw.fused_attention)
        profile.hardware = hw
        if run.layout.sequence_parallel:
            profile.add(build_all_tables(profile.source, [(run.layout.tp, True)]))
        cache[key] = profile
    return cache[key]


def _fastest(run: Run, profile: ModelProfile, hw: Hardware) -> tuple[bool, Estimate] | None:
    """The fastest candidate that fits (the least memory among them when none fits: the published run did fit,
    so that is the planner's error), and whether it fits."""
    profile.hardware = hw
    best: tuple[bool, float, Estimate] | None = None
    for plan in _candidates(run, hw):
        priced = price_plan(profile, plan, hw, hw.memory_bytes, compare=False)
        est = priced.estimate
        key = (priced.fits, -est.step_seconds if priced.fits else -est.memory["total"])
        if best is None or key > best[:2]:
            best = (*key, est)
    return None if best is None else (best[0], best[2])


def price_run(run: Run, cache: dict[Any, ModelProfile] | None = None) -> Result:
    """The run's layout priced with the fastest choice that fits of what the publication leaves open, on its
    GPUs (a site's stated part, at the middle of its stated peak; at each end of it too)."""
    start = time.perf_counter()
    base = load_hardware(run.hardware)
    hw = run.site.hardware(base) if run.site is not None else base
    profile = _profile(run, hw, {} if cache is None else cache)
    found = _fastest(run, profile, hw)
    if found is None:
        return Result(run, None, False, seconds=time.perf_counter() - start)
    fits, est = found
    bounds = None
    if run.site is not None:
        ends = [_fastest(run, profile, run.site.hardware(base, peak)) for peak in run.site.bf16_peak]
        bounds = tuple(_throughput(run, e[1], hw.peak_flops["bfloat16"]) for e in ends if e is not None)
    chosen = {k: getattr(est.plan, k) for k in ("microbatches", "schedule", "stages_per_rank", "checkpoint", "fsdp", "async_tp",
                                                "compile")}
    return Result(run, est, fits, _throughput(run, est, hw.peak_flops["bfloat16"]), time.perf_counter() - start,
                  chosen, bounds)


def layout_text(plan: Plan) -> str:
    parts = [f"TP{plan.tp}", f"PP{plan.pp}", f"DP{plan.dp // plan.cp}"] + ([f"CP{plan.cp}"] if plan.cp > 1 else [])
    extra = [x for x, on in (("SP", plan.sequence_parallel), ("async TP", plan.async_tp), ("FSDP", plan.fsdp), (f"ZeRO-{plan.zero}", plan.zero in (1, 2)),
                             ("compile", plan.compile), (f"fp8 {plan.fp8}", plan.fp8)) if on]
    return " x ".join(parts) + (f" ({', '.join(extra)})" if extra else "")


def chosen_text(result: Result) -> str:
    c = result.chosen
    if not c:
        return ""
    sched = c["schedule"] + (f" x{c['stages_per_rank']}" if c["stages_per_rank"] > 1 else "")
    count = c["microbatches"]
    return (f"{count} micro-batch{'es' if count > 1 else ''}, {sched}, {c['checkpoint']}"
            f"{', fsdp' if c['fsdp'] else ''}{', compile' if c['compile'] else ''}{', async tp' if c['async_tp'] else ''}")


def _memory(r: Result) -> str:
    if r.estimate is None:
        return "-"
    text = f"{r.estimate.memory['total'] / 2**30:.1f}"
    return text + (f" ({r.run.memory_gib})" if r.run.memory_gib else "")


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def table(results: list[Result], markdown: bool = False) -> str:
    head = ["system", "run", "hardware", "GPUs", "layout", "batch", "published", "predicted", "ratio",
            "GiB predicted (published)", "open knobs chosen"]
    rows = []
    for r in results:
        run = r.run
        fmt = (lambda x: f"{x:,.1f}") if run.unit != "tokens/s/GPU" else (lambda x: f"{x:,.0f}")
        predicted = "-" if r.estimate is None else fmt(r.predicted) + ("" if r.fits else " (does not fit)") + (
            f" ({'-'.join(fmt(b) for b in r.bounds)})" if r.bounds else "")
        gpu = run.hardware + (f" ({run.site.label})" if run.site is not None else "")
        rows.append([run.system, run.name, gpu, f"{run.gpus:,}", layout_text(run.layout), str(run.batch),
                     f"{fmt(run.published)} {run.unit}", predicted,
                     "-" if r.estimate is None else f"{r.ratio:.2f}", _memory(r), chosen_text(r)])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths)) for row in [head, *rows])


def summary(results: list[Result]) -> str:
    ratios = [r.ratio for r in results if r.estimate is not None and r.fits]
    within = sum(1 for x in ratios if abs(x - 1) <= 0.15)
    systems = len({r.run.system for r in results})
    return (f"{len(results)} runs from {systems} systems; {len(ratios)} priced as fitting; "
            f"within +-15%: {within}; geometric mean of predicted / published {geometric_mean(ratios):.3f}; "
            f"range {min(ratios, default=math.nan):.2f}-{max(ratios, default=math.nan):.2f}")


def select(system: str | None, pick: Callable[[Run], bool] = lambda r: True) -> list[Run]:
    return [r for r in RUNS if (system is None or system.lower() in r.system.lower()) and pick(r)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", help="only the runs of this system (a part of its name)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (docs/figures.md)")
    parser.add_argument("--parts", action="store_true", help="each run's step in its parts, and its memory")
    args = parser.parse_args()
    cache: dict[Any, ModelProfile] = {}
    results = []
    for run in select(args.system):
        result = price_run(run, cache)
        print(f"  priced {run.system}: {run.name} in {result.seconds:.1f} s", file=sys.stderr, flush=True)
        if args.parts and result.estimate is not None:
            est = result.estimate
            parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in sorted(est.time.items(), key=lambda kv: -kv[1])
                              if v >= 5e-4)
            print(f"    step {est.step_seconds * 1e3:.0f} ms: {parts}; {est.memory['total'] / 2**30:.1f} GiB",
                  file=sys.stderr)
        results.append(result)
    print(table(results, args.markdown))
    print()
    print(summary(results))


if __name__ == "__main__":
    main()
