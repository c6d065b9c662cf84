"""The planner against measurements and published configurations, in one run.

    python bench/planner.py              # CPU: predicted vs measured step time, world 2 and 4; Llama 3 405B
    python bench/planner.py --no-cpu     # only the published configurations (no processes started)

1. This machine (the `cpu` profile, measured by `python -m graphsplit.planner.calibrate`): every plan
   of world 2 and 4 below on the examples is timed for real (gloo processes under torchrun, one thread
   each; bench/planner_worker.py) and predicted by the planner; printed side by side with the rank
   correlation (Spearman) of predicted and measured step times.
2. Llama 3 405B (bench/models/llama3_405b.py) on H100s: the planner's prediction for the published
   configurations, TP8 x PP16 x DP64 on 8,192 GPUs (430 TFLOP/s per GPU) and TP8 x PP16 x DP128 on
   16,384 (400; The Llama 3 Herd of Models, Table 4), taking for the knobs the paper leaves open
   (schedule, checkpointing, FSDP) the fastest choice that fits; and the planner's own best plan for
   the same hardware, with the search time.
3. Long context (context parallelism): Llama 3 405B at 131,072 tokens (bench/models/llama3_405b_128k.py)
   in the published TP8 x CP16 x PP16 layout on 16,384 GPUs (380 TFLOP/s per GPU; the Llama 3 team's
   SC'24 talk, the paper's section 3.3.2), priced as in 2; and Llama 3 70B at 131,072 tokens
   (bench/models/llama3_70b_128k.py) on 64 GPUs: the planner's own best plan, and the best without
   context parallelism (no published figure: the planner's choice and its reason).
4. With --deepseek: DeepSeek-V3 671B (bench/models/deepseek_v3_671b.py, HF's model from the report's config)
   on 2,048 H100s: the report's PP16 x EP64 layout priced, and the planner's own best plan, in tokens per
   second per GPU beside the report's (14.8T tokens in 2.788M GPU hours).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphsplit import Plan  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.plan import rounds_fit  # noqa: E402
from graphsplit.planner import load_hardware, plan_model  # noqa: E402
from graphsplit.planner.estimate import estimate  # noqa: E402
from graphsplit.planner.links import send_flops_per_byte  # noqa: E402
from graphsplit.planner.profile import build_all_tables, profile_model  # noqa: E402
from graphsplit.planner.search import CHECKPOINT_CHOICES  # noqa: E402
from graphsplit.planner.stages import plan_stages  # noqa: E402

WORLDS = {
    2: [Plan(dp=2), Plan(pp=2), Plan(tp=2), Plan(dp=2, fsdp=True), Plan(pp=2, checkpoint="blocks")],
    4: [Plan(dp=4), Plan(pp=4), Plan(tp=4), Plan(dp=2, pp=2), Plan(dp=2, tp=2), Plan(pp=2, tp=2),
        Plan(pp=4, microbatches=8)],
}
MODELS = ("mlp", "gpt", "llama")
PUBLISHED = [(8192, Plan(tp=8, pp=16, dp=64, microbatches=32, autocast="bf16"), 430),
             (16384, Plan(tp=8, pp=16, dp=128, microbatches=16, autocast="bf16"), 400)]


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def measure(model: Path, world: int, plans: list[Plan], steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               str(ROOT / "bench" / "planner_worker.py"), str(model), str(out), str(steps), *(p.to_json() for p in plans)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        return json.loads(out.read_text())


def cpu(steps: int) -> None:
    hw = load_hardware("cpu")
    print(f"this machine: {hw.name}")
    print(f"{'model':6} {'plan':34} {'predicted ms':>13} {'measured ms':>12} {'ratio':>6}")
    predicted, measured = [], []
    for name in MODELS:
        path = ROOT / "examples" / f"{name}.py"
        loaded = load_model(str(path))
        profile = profile_model(loaded, (1, 2, 4), hw.fused_attention)
        profile.hardware = hw
        for world, plans in WORLDS.items():
            usable = []
            for plan in plans:
                try:
                    est = estimate(plan, plan_stages(profile, plan), hw, profile.batch, profile.tokens_per_sample,
                                   profile.model_flops_per_sample)
                except Exception as exc:  # noqa: BLE001 - a plan this model cannot take is skipped, said
                    print(f"{name:6} {describe(plan):34} cannot: {str(exc)[:60]}")
                    continue
                usable.append((plan, est.step_seconds))
            times = measure(path, world, [p for p, _ in usable], steps)
            for (plan, guess), got in zip(usable, times):
                predicted.append(guess)
                measured.append(got)
                print(f"{name:6} {describe(plan):34} {guess * 1e3:13.2f} {got * 1e3:12.2f} {guess / got:6.2f}")
    print(f"rank correlation (Spearman) of predicted and measured step times over {len(measured)} plans: "
          f"{spearman(predicted, measured):.3f} (target >= 0.8)")


def describe(plan: Plan) -> str:
    text = f"dp{plan.dp} pp{plan.pp} tp{plan.tp} mb{plan.num_microbatches}"
    return text + (" fsdp" if plan.fsdp else "") + (f" {plan.checkpoint}" if plan.checkpoint != "none" else "")


def label(plan: Plan) -> str:
    schedule = plan.schedule + (f" x{plan.stages_per_rank}" if plan.stages_per_rank > 1 else "")
    return (f"mb{plan.num_microbatches} {schedule}, {plan.checkpoint}{', fsdp' if plan.fsdp else ''}"
            f"{', sp' if plan.sequence_parallel else ''}{', async tp' if plan.async_tp else ''}, "
            f"{plan.autocast or 'fp32'}{', compiled' if plan.compile else ''}")


def breakdown(est: Any) -> str:
    """Where the step's seconds go (the planner's `time`), largest first."""
    parts = sorted(est.time.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.2f} s" for k, v in parts if v >= 0.005)


def fastest_fitting(profile: Any, hw: Any, shape: Plan) -> Any:
    """A published layout (tp, pp, dp, cp, micro-batches, precision) with the fastest choice that fits of
    what the publication leaves open: schedule and stages per rank, checkpointing, FSDP, compile, sequence
    parallelism and async TP; None when nothing fits."""
    best = None
    for schedule, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4), ("interleaved-1f1b", 8)):
        for checkpoint in CHECKPOINT_CHOICES:
            for fsdp, compiled, (sp, ring) in itertools.product((False, True), (False, True),
                                                                ((False, False), (True, False), (True, True))):
                # the cut weighs a byte sent as the search does on this hardware
                plan = shape.replace(schedule=schedule, stages_per_rank=v, checkpoint=checkpoint, fsdp=fsdp,
                                     compile=compiled, sequence_parallel=sp, async_tp=ring,
                                     send_flops_per_byte=send_flops_per_byte(hw, shape.tp, shape.autocast is not None))
                est = estimate(plan, plan_stages(profile, plan), hw, profile.batch, profile.tokens_per_sample,
                               profile.model_flops_per_sample)
                if est.memory["total"] <= 0.95 * hw.memory_bytes and (best is None or est.step_seconds < best.step_seconds):
                    best = est
    return best


def published() -> None:
    hw = load_hardware("h100")
    model = ROOT / "bench" / "models" / "llama3_405b.py"
    loaded = load_model(str(model))
    start = time.perf_counter()
    profile = profile_model(loaded, (8,), hw.fused_attention)
    profile.hardware = hw
    profile.add(build_all_tables(profile.source, [(8, True)]))
    print(f"\nLlama 3 405B on {hw.name} (profile in {time.perf_counter() - start:.1f} s)")
    for gpus, shape, reported in PUBLISHED:
        best = fastest_fitting(profile, hw, shape)
        if best is None:
            print(f"  {gpus} GPUs, TP8 x PP16 x DP{shape.dp}: no choice of schedule, checkpointing and FSDP fits")
            continue
        tflops = best.mfu * hw.peak_flops["bfloat16"] / 1e12
        print(f"  {gpus} GPUs, TP8 x PP16 x DP{shape.dp} ({label(best.plan)}): predicted {tflops:.0f} TFLOP/s per GPU, "
              f"published {reported} ({tflops / reported:.2f}x); step {best.step_seconds:.1f} s, "
              f"{best.memory['total'] / 2**30:.1f} GiB per GPU")
        print(f"    time: {breakdown(best)}")
        start = time.perf_counter()
        result, _ = plan_model(loaded, gpus, hw.memory_bytes, hw)
        took = time.perf_counter() - start
        if result.fits:
            own = result.plans[0]
            p = own.plan
            print(f"    planner's own best ({took:.1f} s search): tp{p.tp} pp{p.pp} dp{p.dp} {label(p)}: "
                  f"{own.mfu * hw.peak_flops['bfloat16'] / 1e12:.0f} TFLOP/s per GPU, step {own.step_seconds:.1f} s, "
                  f"{own.memory['total'] / 2**30:.1f} GiB; {'at least as fast' if own.step_seconds <= best.step_seconds else 'SLOWER'}")
            print(f"    time: {breakdown(own)}")
            zb = next((e for e in result.plans if e.plan.schedule in ("zero-bubble", "zbv", "dualpipev")), None)
            if zb is not None:  # why the search's zero-bubble plans lose: see the refusal in plan.py
                p = zb.plan
                print(f"    best zero-bubble plan: tp{p.tp} pp{p.pp} dp{p.dp} {label(p)}: "
                      f"{zb.mfu * hw.peak_flops['bfloat16'] / 1e12:.0f} TFLOP/s per GPU, step {zb.step_seconds:.1f} s "
                      "(under --compile with FSDP, bf16 and tp > 1 zero-bubble is refused: torch's weight backward "
                      "fails there)")
        else:
            print(f"    planner's own search ({took:.1f} s): nothing fits")


# Llama 3 405B's long-context stage: TP8 x CP16 x PP16 on 16,384 H100s (DP 8), 16M tokens per batch
LONG_PUBLISHED = (16384, Plan(tp=8, pp=16, dp=128, cp=16, microbatches=16, autocast="bf16"), 380)


def long_context() -> None:
    """Context parallelism at 131,072 tokens: the published 405B layout priced, and the planner's choice
    for 70B on 64 GPUs beside the best plan without it."""
    hw = load_hardware("h100")
    loaded = load_model(str(ROOT / "bench" / "models" / "llama3_405b_128k.py"))
    start = time.perf_counter()
    profile = profile_model(loaded, (8,), hw.fused_attention)
    profile.hardware = hw
    profile.add(build_all_tables(profile.source, [(8, True)]))
    gpus, shape, reported = LONG_PUBLISHED
    print(f"\nLlama 3 405B at 131,072 tokens on {hw.name} (profile in {time.perf_counter() - start:.1f} s)")
    best = fastest_fitting(profile, hw, shape)
    if best is None:
        print(f"  {gpus} GPUs, TP8 x CP16 x PP16: no choice of schedule, checkpointing and FSDP fits")
    else:
        tflops = best.mfu * hw.peak_flops["bfloat16"] / 1e12
        print(f"  {gpus} GPUs, TP8 x CP16 x PP16 x DP8 ({label(best.plan)}): predicted {tflops:.0f} TFLOP/s per GPU, "
              f"published {reported} ({tflops / reported:.2f}x); step {best.step_seconds:.1f} s, "
              f"{best.memory['total'] / 2**30:.1f} GiB per GPU")
        print(f"    time: {breakdown(best)}")
    loaded = load_model(str(ROOT / "bench" / "models" / "llama3_70b_128k.py"))
    start = time.perf_counter()
    result, _ = plan_model(loaded, 64, hw.memory_bytes, hw)
    took = time.perf_counter() - start
    print(f"\nLlama 3 70B at 131,072 tokens, batch 8, on 64 x {hw.name} ({took:.1f} s search)")
    if not result.fits:
        print("  nothing fits")
        return
    without = next((e for e in result.plans if e.plan.cp == 1), None)
    for what, est in (("planner's best", result.plans[0]), ("best without cp", without)):
        if est is None:
            print(f"  {what}: none fits")
            continue
        p = est.plan
        tflops = est.mfu * hw.peak_flops["bfloat16"] / 1e12
        print(f"  {what}: tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} {label(p)}: {tflops:.0f} TFLOP/s per GPU, "
              f"step {est.step_seconds:.1f} s, {est.memory['total'] / 2**30:.1f} GiB")
        print(f"    time: {breakdown(est)}")
    if without is not None and result.plans[0].plan.cp > 1:
        print(f"  context parallelism: {without.step_seconds / result.plans[0].step_seconds:.2f}x faster than without")


# DeepSeek-V3 (technical report): 2.788M H800 GPU hours for 14.8T tokens, on 2,048 GPUs with PP16 x EP64 and
# ZeRO-1 data parallelism, no tensor parallelism (sections 3.2 and 1): 14.8e12 / 2.788e6 / 3600 tokens/s per GPU
DEEPSEEK_TOKENS_PER_GPU_SECOND = 14.8e12 / 2.788e6 / 3600
DEEPSEEK_SHAPE = Plan(pp=16, dp=128, ep=64, autocast="bf16")


def deepseek() -> None:
    """DeepSeek-V3 671B on 2,048 H100s (the report's H800s have the H100's compute, less NVLink): the
    published layout priced with the fastest choice of what the report leaves open, and the planner's own
    best plan, in tokens per second per GPU beside the report's."""
    hw = load_hardware("h100")
    loaded = load_model(str(ROOT / "bench" / "models" / "deepseek_v3_671b.py"))
    start = time.perf_counter()
    profile = profile_model(loaded, (1,), hw.fused_attention)
    profile.hardware = hw
    print(f"\nDeepSeek-V3 671B on 2,048 x {hw.name} (profile in {time.perf_counter() - start:.1f} s; "
          f"{profile.experts} experts per MoE layer)")
    reported = DEEPSEEK_TOKENS_PER_GPU_SECOND
    best = None
    for schedule, v in (("1f1b", 1), ("interleaved-1f1b", 2)):
        for m in (16, 32, 48, 60, 120):
            if v > 1 and not rounds_fit(schedule, DEEPSEEK_SHAPE.pp, m):
                continue
            for checkpoint, fsdp, compiled in itertools.product(("none", "selective", "blocks", "stage"), (False, True),
                                                                (False, True)):
                plan = DEEPSEEK_SHAPE.replace(schedule=schedule, stages_per_rank=v, microbatches=m,
                                              checkpoint=checkpoint, fsdp=fsdp, compile=compiled,
                                              send_flops_per_byte=send_flops_per_byte(hw, 1, True))
                est = estimate(plan, plan_stages(profile, plan), hw, profile.batch, profile.tokens_per_sample,
                               profile.model_flops_per_sample)
                if est.memory["total"] <= 0.95 * hw.memory_bytes and (best is None or est.step_seconds < best.step_seconds):
                    best = est
    if best is None:
        print("  PP16 x EP64 x DP128: no choice of schedule, micro-batches, checkpointing and FSDP fits")
    else:
        rate = best.tokens_per_second / 2048
        print(f"  PP16 x EP64 x DP128 ({label(best.plan)}): predicted {rate:,.0f} tokens/s per GPU, published "
              f"{reported:,.0f} ({rate / reported:.2f}x); step {best.step_seconds:.1f} s, "
              f"{best.memory['total'] / 2**30:.1f} GiB per GPU")
        print(f"    time: {breakdown(best)}")
    start = time.perf_counter()
    result, _ = plan_model(loaded, 2048, hw.memory_bytes, hw)
    took = time.perf_counter() - start
    if result.fits:
        own = result.plans[0]
        p = own.plan
        rate = own.tokens_per_second / 2048
        print(f"    planner's own best ({took:.0f} s search, {result.considered:,} plans): tp{p.tp} pp{p.pp} dp{p.dp} "
              f"ep{p.ep} {label(p)}: {rate:,.0f} tokens/s per GPU ({rate / reported:.2f}x), step {own.step_seconds:.1f} s, "
              f"{own.memory['total'] / 2**30:.1f} GiB")
        print(f"    time: {breakdown(own)}")
    else:
        print(f"    planner's own search ({took:.0f} s): nothing fits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cpu", action="store_true", help="skip the measured CPU runs")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--deepseek", action="store_true", help="also DeepSeek-V3 671B on 2,048 GPUs (minutes)")
    args = parser.parse_args()
    if not args.no_cpu:
        cpu(args.steps)
    published()
    long_context()
    if args.deepseek:
        deepseek()


if __name__ == "__main__":
    main()
