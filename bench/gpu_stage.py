"""One pipeline stage of a Llama-shaped model on one GPU: graphsplit's program against the untouched eager
model at the same precision, beside the planner's prediction for the same stage, in one run.

    python bench/gpu_stage.py                     # 8 layers of Llama 3 8B's width, 2 x 8,192 tokens, bf16
    python bench/gpu_stage.py --plans none,blocks # fewer plans
    python bench/gpu_stage.py --small             # tiny shapes: checks the script itself (CPU is fine)
    python bench/gpu_stage.py --plans none --fp8  # FP8 linears (torchao's recipes) beside eager torchao
    python bench/gpu_stage.py --predict-only h200 # the planner's columns alone, on any machine

The stage: the Llama example (examples/llama.py: RMSNorm, rotary, GQA through scaled_dot_product_attention,
SwiGLU) at Llama 3 8B's width (dim 4,096, 32 heads, 8 key/value heads, FFN 14,336, vocabulary 128,256), with
fewer layers, embedding and LM head included: the busiest stage of an 8B model cut in four (pp 1, so no
pipeline communication: what one GPU can measure).

1. The GPU itself: a bf16 8192^3 matmul and a device-to-device copy, against the hardware profile's peak
   figures (h100 or h200, chosen by the device's name).
2. Eager: the model built on the GPU in fp32, a step under torch.autocast(bf16): forward, loss, backward,
   AdamW as `run --optimizer adamw` makes it (fused on a GPU), as a user would write it.
3. graphsplit: `graphsplit run <model> --autocast bf16 --optimizer adamw` (torchrun, one process, nccl) for each
   plan in --plans (checkpoint none / blocks / selective, and --compile), its step time and
   torch.cuda.max_memory_allocated from --metrics.
4. The planner's prediction for each plan on the same hardware profile: step time, memory, MFU.

Step time: the median over the steps after --warmup. MFU counts forward + backward as 3x the untouched model's
forward FLOPs (the planner's count, attention included) over the profile's dense bf16 peak, for every row alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphsplit import Plan  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402
from graphsplit.planner import load_hardware  # noqa: E402
from graphsplit.planner.estimate import estimate  # noqa: E402
from graphsplit.planner.profile import profile_model  # noqa: E402
from graphsplit.planner.stages import plan_stages  # noqa: E402
from graphsplit.runtime.training import make_optimizer  # noqa: E402

MODEL = '''
import sys
sys.path.insert(0, {models!r})
from llama3 import model_file

CONFIG = {config!r}
build_model, example_inputs, example_target, loss_fn = model_file(CONFIG, {batch})
'''

WIDTH_8B = dict(dim=4096, n_heads=32, n_kv_heads=8, hidden=14336, vocab_size=128256, max_seq_len=8192)
SMALL = dict(dim=64, n_heads=4, n_kv_heads=2, hidden=128, vocab_size=256, max_seq_len=32)
PLANS = {
    "none": Plan(autocast="bf16"),
    "blocks": Plan(autocast="bf16", checkpoint="blocks"),
    "selective": Plan(autocast="bf16", checkpoint="selective"),
    "compiled": Plan(autocast="bf16", compile=True),
    "fp8": Plan(autocast="bf16", fp8="tensorwise"),
    "fp8-rowwise": Plan(autocast="bf16", fp8="rowwise"),
    "fp8-compiled": Plan(autocast="bf16", fp8="tensorwise", compile=True),
    "fp8-rowwise-compiled": Plan(autocast="bf16", fp8="rowwise", compile=True),
}
FLAGS = {"none": [], "blocks": ["--checkpoint", "blocks"], "selective": ["--checkpoint", "selective"],
         "compiled": ["--compile"], "fp8": ["--fp8", "tensorwise"], "fp8-rowwise": ["--fp8", "rowwise"],
         "fp8-compiled": ["--fp8", "tensorwise", "--compile"],
         "fp8-rowwise-compiled": ["--fp8", "rowwise", "--compile"]}


def profile_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return "h200" if "H200" in torch.cuda.get_device_name(device) else "h100"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def the_gpu(device: torch.device, hw: Any) -> None:
    """A large bf16 matmul's rate and a copy's bandwidth, beside the profile's peak and assumed efficiencies."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    tflops = 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    bandwidth = 2 * src.numel() * 10 / (time.perf_counter() - start) / 1e12
    peak = hw.peak_flops["bfloat16"] / 1e12
    print(f"bf16 {n}^3 matmul: {tflops:.0f} TFLOP/s = {tflops / peak:.2f} of the profile's peak {peak:.0f} "
          f"(profile assumes matmul_efficiency {hw.matmul_efficiency}); copy {bandwidth:.2f} TB/s read+written = "
          f"{bandwidth * 1e12 / hw.memory_bandwidth:.2f} of {hw.memory_bandwidth / 1e12:.1f} "
          f"(profile assumes memory_efficiency {hw.memory_efficiency})", flush=True)


def timed(device: torch.device, fn: Any, repeat: int = 5) -> float:
    """Median seconds of `fn()` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernels(device: torch.device, hw: Any, config: dict[str, int], tokens: int) -> None:
    """The stage's own kernels one by one: each linear's forward matmul at the stage's token count, the
    attention (flash, causal) forward and backward, an fp32 add and an fp32 -> bf16 cast of the residual
    stream: the rates the planner's efficiencies stand for."""
    bf16 = torch.bfloat16
    dim, kv = config["dim"], config["dim"] // config["n_heads"] * config["n_kv_heads"]
    shapes = {"wq/wo": (dim, dim), "wk/wv": (dim, kv), "w1/w3": (dim, config["hidden"]), "w2": (config["hidden"], dim),
              "output": (dim, config["vocab_size"])}
    peak = hw.peak_flops["bfloat16"]
    parts = []
    for name, (k, n) in shapes.items():
        x = torch.randn(tokens, k, device=device, dtype=bf16)
        w = torch.randn(n, k, device=device, dtype=bf16)
        seconds = timed(device, lambda x=x, w=w: torch.nn.functional.linear(x, w))
        parts.append(f"{name} {2 * tokens * k * n / seconds / peak:.2f}")
    print("matmul, fraction of peak: " + ", ".join(parts), flush=True)
    heads, seq = config["n_heads"], config["max_seq_len"]
    batch = max(1, tokens // seq)
    q = torch.randn(batch, heads, seq, dim // heads, device=device, dtype=bf16, requires_grad=True)
    k, v = (torch.randn_like(q, requires_grad=True) for _ in range(2))
    flops = 4 * batch * heads * seq * seq * (dim // heads) / 2  # causal: half the scores
    forward = timed(device, lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    backward = timed(device, lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    a = torch.randn(tokens, dim, device=device)
    b = torch.randn_like(a)
    add = timed(device, lambda: a + b)
    cast = timed(device, lambda: a.to(bf16))
    bandwidth = hw.memory_bandwidth
    print(f"attention (causal, {seq} tokens): forward {flops / forward / peak:.2f} of peak, backward "
          f"{2.5 * flops / backward / peak:.2f} (2.5x the forward's FLOPs); fp32 add {3 * a.nbytes / add / bandwidth:.2f}"
          f" of memory bandwidth, fp32->bf16 cast {1.5 * a.nbytes / cast / bandwidth:.2f}", flush=True)


def eager(loaded: Any, device: torch.device, steps: int, warmup: int, lr: float,
          fp8: str | None = None, compiled: bool = False) -> tuple[list[float], float, int]:
    """The untouched model, fp32 parameters, forward under autocast bf16, AdamW: (step seconds, first loss,
    peak bytes). Prints the median forward (with the loss), backward and optimizer seconds. `fp8`: its
    nn.Linear modules converted by torchao's recipe of that name first (what --fp8 is compared with);
    `compiled`: then run under torch.compile, as torchao's float8 training is meant to run."""
    model = loaded.build(device, seed=0)
    if fp8 is not None:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(fp8),
                                   module_filter_fn=lambda m, fqn: m.in_features % 16 == 0 and m.out_features % 16 == 0)
    forward_fn = torch.compile(model) if compiled else model
    # the optimizer `run --optimizer adamw` makes (fused on a GPU), so the two sides differ only in the model
    optimizer = make_optimizer("adamw", list(model.parameters()), lr)
    inputs = tuple(t.to(device) for t in loaded.args)
    target = loaded.target.to(device)
    times, parts, first = [], [], 0.0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(steps):
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loaded.loss_fn(forward_fn(*inputs), target)
        sync(device)
        forward = time.perf_counter()
        loss.backward()
        sync(device)
        backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - start)
        parts.append((forward - start, backward - forward, times[-1] - (backward - start)))
        if step == 0:
            first = loss.item()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    split = [statistics.median(p[i] for p in parts[warmup:]) for i in range(3)]
    print(f"eager{f' fp8 {fp8}' if fp8 else ''}{' compiled' if compiled else ''}: forward {split[0]:.3f} s, backward {split[1]:.3f} s, optimizer {split[2]:.3f} s", flush=True)
    del model, optimizer
    return times[warmup:], first, peak


def graphsplit_run(path: Path, name: str, steps: int, lr: float, timeout: float) -> tuple[list[float], float, int] | str:
    """`graphsplit run` under torchrun: (step seconds after warm-up, first loss, peak bytes), or why it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [sys.executable, "-m", "graphsplit", "run", str(path), "--autocast", "bf16", "--optimizer", "adamw",
               "--lr", str(lr), "--steps", str(steps), "--metrics", str(metrics), "--timeout", str(timeout),
               *FLAGS[name]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
        if done.returncode:
            return f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["step_seconds"] for r in rows], rows[0]["loss"], max(r["max_memory_bytes"] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--plans", default="none,blocks,selective,compiled")
    parser.add_argument("--fp8", action="store_true",
                        help="also --fp8 tensorwise and rowwise (torchao), beside the eager model torchao converts")
    parser.add_argument("--eager-fp8", default="", metavar="RECIPES",
                        help="eager rows for these torchao recipes (tensorwise,rowwise), without --fp8's")
    parser.add_argument("--eager-compile", action="store_true", help="the eager fp8 rows under torch.compile")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for each graphsplit run")
    parser.add_argument("--small", action="store_true", help="tiny shapes, to check the script")
    parser.add_argument("--predict-only", metavar="PROFILE",
                        help="only the planner's predictions on this hardware profile (h100, h200): no device needed")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hw = load_hardware(args.predict_only or profile_name(device))
    config = {**(SMALL if args.small else WIDTH_8B), "n_layers": args.layers}
    names = args.plans.split(",") + (["fp8", "fp8-rowwise"] if args.fp8 else [])
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"profile {hw.name}; model {config}, batch {args.batch}", flush=True)
    if device.type == "cuda" and not args.predict_only:
        the_gpu(device, hw)
        kernels(device, hw, config, args.batch * config["max_seq_len"])
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama_stage.py"
        path.write_text(MODEL.format(models=str(ROOT / "bench" / "models"), config=config, batch=args.batch))
        loaded = load_model(str(path))
        start = time.perf_counter()
        profile = profile_model(loaded, (1,), hw.fused_attention)
        profile.hardware = hw
        predicted = {name: estimate(PLANS[name], plan_stages(profile, PLANS[name]), hw, profile.batch,
                                    profile.tokens_per_sample, profile.model_flops_per_sample) for name in names}
        print(f"planner profile and predictions in {time.perf_counter() - start:.1f} s", flush=True)
        work = 3 * profile.model_flops_per_sample * profile.batch
        peak_flops = hw.peak_flops["bfloat16"]
        if args.predict_only:
            for name, est in predicted.items():
                print(f"program {name:25} predicted {est.step_seconds:.3f} s, {est.memory['total'] / 2**30:.1f} GiB, "
                      f"MFU {est.mfu:.1%}  (" + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in est.time.items()
                                                           if v >= 5e-4) + ")")
            return
        rows: list[tuple[str, Any, Any]] = []
        measured = eager(loaded, device, args.steps, args.warmup, args.lr)
        print(f"eager: {measured}", flush=True)
        rows.append(("eager (torch.autocast bf16)", measured, None))
        recipes = ["tensorwise", "rowwise"] if args.fp8 else [r for r in args.eager_fp8.split(",") if r]
        for recipe in recipes:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            label = f"eager fp8 {recipe} (torchao{', compiled' if args.eager_compile else ''})"
            got = eager(loaded, device, args.steps, args.warmup, args.lr, recipe, args.eager_compile)
            print(f"{label}: {got}", flush=True)
            rows.append((label, got, None))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for name in names:
            got = graphsplit_run(path, name, args.steps, args.lr, args.timeout)
            print(f"program {name}: {got if isinstance(got, str) else (got[0][args.warmup:], got[1], got[2])}",
                  flush=True)
            if not isinstance(got, str):
                got = (got[0][args.warmup:], got[1], got[2])
            rows.append((f"program {name}", got, predicted[name]))
    base = statistics.median(rows[0][1][0])
    print(f"\n{'':42} {'step s':>8} {'vs eager':>8} {'peak GiB':>9} {'MFU':>6} {'loss 1':>9} | "
          f"{'predicted s':>11} {'GiB':>6} {'MFU':>6} {'meas/pred':>9}")
    for label, got, est in rows:
        if isinstance(got, str):
            print(f"{label:42} failed: {got}")
            continue
        step = statistics.median(got[0])
        line = (f"{label:42} {step:8.3f} {step / base:8.2f} {got[2] / 2**30:9.1f} {work / step / peak_flops:6.1%} "
                f"{got[1]:9.4f}")
        if est is not None:
            line += (f" | {est.step_seconds:11.3f} {est.memory['total'] / 2**30:6.1f} {est.mfu:6.1%} "
                     f"{step / est.step_seconds:9.2f}")
            line += "   (" + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in est.time.items() if v >= 5e-4) + ")"
        print(line)


if __name__ == "__main__":
    main()
