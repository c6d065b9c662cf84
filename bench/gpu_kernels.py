"""Matmul rates on one GPU by shape, bf16 against FP8, beside the hardware profile's single efficiency.

    python bench/gpu_kernels.py              # the grid below, bf16 and FP8 (where the GPU has FP8)
    python bench/gpu_kernels.py --quick      # a few shapes: checks the script itself (CPU is fine)
    python bench/gpu_kernels.py --grid gemm.json   # the profile's table: every (M, K, N) of a log grid

The planner prices every matmul at one efficiency (the profile's `matmul_efficiency`, 0.78 of the dense
bf16 peak on Hopper, measured on an 8B Llama stage's linears at 16,384 tokens). Small models and
tensor-parallel shards run smaller GEMMs, which reach less of the peak. This prints what each shape
reaches, the figures a size-dependent efficiency is to be read from:

- the linears of decoder blocks at hidden sizes 2,048 / 4,096 / 8,192 (QKV, attention output, the
  SwiGLU FFN's up and down projections at Llama's FFN ratio), each cut by tp 1, 2, 4 and 8 the way
  Megatron cuts them (column-parallel: N / tp; row-parallel: K / tp), at 2,048, 8,192 and 32,768 tokens
  per micro-batch; and the square 8192^3 matmul;
- the same shapes in FP8 (e4m3 operands, `torch._scaled_mm`, one scale per tensor and one per row,
  bf16 out), as torchao's float8 training runs its linears forward: the speed-up FP8 buys per shape.

Each figure is the median of timed calls after warm-up, as TFLOP/s and as a fraction of the
profile's dense peak (bf16 989 TFLOP/s on H100/H200; FP8 twice that).

`--grid FILE` measures the table a hardware profile prices matmuls from (`matmul_table`: planner/hardware.py):
every M x K x N of powers of two from 256 to 32,768, bf16 (F.linear) and FP8 (e4m3, one scale per tensor,
bf16 out), each timed as a training step runs it, calls back to back on the stream between two CUDA events
(no host sync between calls), and writes the fractions of peak as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphsplit.planner import load_hardware  # noqa: E402

# hidden -> FFN (Llama 3's: 8B 14,336 at 4,096; 70B 28,672 at 8,192; a 1-2B model 8,192 at 2,048)
WIDTHS = {2048: 8192, 4096: 14336, 8192: 28672}
TOKENS = (2048, 8192, 32768)
TPS = (1, 2, 4, 8)


def shapes(hidden: int, ffn: int, tp: int) -> dict[str, tuple[int, int]]:
    """(K, N) of a block's linears on one tp rank: column-parallel cut N, row-parallel cut K.
    QKV with 8 key/value heads of 128 (GQA, as Llama 3)."""
    kv = 2 * 8 * 128
    return {"qkv": (hidden, (hidden + kv) // tp), "attn out": (hidden // tp, hidden),
            "ffn up": (hidden, 2 * ffn // tp), "ffn down": (ffn // tp, hidden)}


def timed(fn, repeat: int) -> float:
    """Median seconds of fn() (CUDA events on a GPU), after warm-up calls."""
    for _ in range(3):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    times = []
    for _ in range(repeat):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(times)


def bf16_rate(m: int, k: int, n: int, device: torch.device, repeat: int) -> float:
    """FLOP/s of x @ w.T (F.linear, as a Linear runs) in bf16."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    return 2 * m * k * n / timed(lambda: torch.nn.functional.linear(x, w), repeat)


def fp8_rate(m: int, k: int, n: int, device: torch.device, repeat: int, rowwise: bool) -> float | None:
    """FLOP/s of the same product with e4m3 operands and bf16 output (torch._scaled_mm), or None where
    this GPU or torch has no FP8 matmul."""
    if device.type != "cuda" or not hasattr(torch, "float8_e4m3fn"):
        return None
    x = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
    if rowwise:
        sx = torch.ones(m, 1, device=device)
        sw = torch.ones(1, n, device=device)
    else:
        sx = torch.ones((), device=device)
        sw = torch.ones((), device=device)
    # _scaled_mm wants the second operand column-major: w.t() of a row-major [n, k] is exactly that
    try:
        def run():
            return torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)

        run()
    except (RuntimeError, TypeError) as exc:
        print(f"  fp8 {'rowwise' if rowwise else 'tensorwise'} {m}x{k}x{n}: unavailable ({str(exc)[:120]})")
        return None
    return 2 * m * k * n / timed(run, repeat)


GRID = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def streamed(fn, budget: float = 0.004, repeat: int = 5) -> float:
    """Seconds of one fn() as a step runs it: calls back to back (enough to fill `budget` seconds) between
    two CUDA events, the median of `repeat` such runs, after warm-up. (On a CPU: a plain timer, to check
    the script.)"""
    for _ in range(2):
        fn()
    if not torch.cuda.is_available():
        return timed(fn, repeat)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(1, min(200, round(budget / max(begin.elapsed_time(end) / 1e3, 1e-7))))
    times = []
    for _ in range(repeat):
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def grid(path: Path, grid_sizes: tuple[int, ...], hw) -> None:
    """Every M x K x N of `grid_sizes`, bf16 and FP8 tensorwise, as fractions of the profile's peaks: JSON."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    low = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = {"bfloat16": hw.peak_flops["bfloat16"], "float8": hw.peak_flops.get("float8", 2 * hw.peak_flops["bfloat16"])}
    table = {dtype: [[[0.0] * len(grid_sizes) for _ in grid_sizes] for _ in grid_sizes] for dtype in peak}
    start = time.perf_counter()
    one = torch.ones((), device=device)
    for i, m in enumerate(grid_sizes):
        for j, k in enumerate(grid_sizes):
            x = torch.randn(m, k, device=device, dtype=low)
            x8 = x.to(torch.float8_e4m3fn)
            for n_index, n in enumerate(grid_sizes):
                w = torch.randn(n, k, device=device, dtype=low)
                w8 = w.to(torch.float8_e4m3fn)
                flops = 2 * m * k * n
                table["bfloat16"][i][j][n_index] = round(
                    flops / streamed(lambda x=x, w=w: torch.nn.functional.linear(x, w)) / peak["bfloat16"], 4)
                if device.type != "cuda":  # no float8 matmul on a CPU: the script's check ends here
                    continue
                table["float8"][i][j][n_index] = round(flops / streamed(
                    lambda x8=x8, w8=w8: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16)) / peak["float8"], 4)
                del w, w8
            print(f"M {m:6} K {k:6}: bf16 " + " ".join(f"{e:.2f}" for e in table["bfloat16"][i][j])
                  + " | fp8 " + " ".join(f"{e:.2f}" for e in table["float8"][i][j]), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    # attention (scaled_dot_product_attention, 32 heads of 128, 32,768 tokens a call): forward and backward
    # rates by sequence length, its FLOPs counted as torch counts them (the whole square, causal or not)
    attention: dict[str, dict[str, list[float]]] = {}
    seqs = (1024, 2048, 4096, 8192, 16384, 32768) if device.type == "cuda" else (64,)
    attend = torch.nn.functional.scaled_dot_product_attention
    for causal in (True, False):
        rates: dict[str, list[float]] = {"forward": [], "backward": []}
        for seq in seqs:
            q = torch.randn(max(1, 32768 // seq), 32, seq, 128, device=device, dtype=low, requires_grad=True)
            k, v = (torch.randn_like(q, requires_grad=True) for _ in range(2))
            flops = 4 * q.shape[0] * 32 * seq * seq * 128
            out = attend(q, k, v, is_causal=causal)
            grad = torch.randn_like(out)
            forward = streamed(lambda q=q, k=k, v=v, causal=causal: attend(q, k, v, is_causal=causal))
            backward = streamed(lambda out=out, q=q, k=k, v=v, grad=grad: torch.autograd.grad(
                out, (q, k, v), grad, retain_graph=True))
            rates["forward"].append(round(flops / forward / peak["bfloat16"], 4))
            rates["backward"].append(round(2 * flops / backward / peak["bfloat16"], 4))
            del q, k, v, out, grad
        attention["causal" if causal else "full"] = rates
        print(f"attention {'causal' if causal else 'full'} by sequence {list(seqs)}: forward {rates['forward']}, "
              f"backward {rates['backward']} (2x the forward's FLOPs)", flush=True)
    path.write_text(json.dumps({"attention_sequences": list(seqs), "attention": attention, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
                                "date": time.strftime("%Y-%m-%d"), "sizes": list(grid_sizes),
                                "fractions_of": {d: p for d, p in peak.items()}, **table}, indent=1))
    print(f"grid of {len(grid_sizes) ** 3} shapes in {time.perf_counter() - start:.0f} s: {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few small shapes, to check the script")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--grid", type=Path, metavar="FILE",
                        help="measure the profile's matmul table (M, K, N from 256 to 32,768) into FILE as JSON")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    hw = load_hardware("h200" if "H200" in name else "h100")
    peak = hw.peak_flops["bfloat16"]
    print(f"torch {torch.__version__}, {name}; fractions of {hw.name}'s dense bf16 peak {peak / 1e12:.0f} TFLOP/s "
          f"(FP8 columns: of twice that); the profile prices every matmul at {hw.matmul_efficiency}", flush=True)
    widths = {256: 512} if args.quick else WIDTHS
    tokens = (256,) if args.quick else TOKENS
    tps = (1, 2) if args.quick else TPS
    if args.grid:
        grid(args.grid, (256, 512) if args.quick else GRID, hw)
        return
    rows = []
    if not args.quick:
        rate = bf16_rate(8192, 8192, 8192, device, args.repeat)
        print(f"8192^3 bf16: {rate / 1e12:.0f} TFLOP/s = {rate / peak:.3f}", flush=True)
    print(f"{'hidden':>6} {'tp':>3} {'tokens':>6} {'linear':>9} {'K':>6} {'N':>6} | {'bf16':>6} "
          f"{'fp8 tensor':>10} {'fp8 row':>8} {'fp8/bf16':>8}", flush=True)
    for hidden, ffn in widths.items():
        for tp in tps:
            for m in tokens:
                for linear, (k, n) in shapes(hidden, ffn, tp).items():
                    bf16 = bf16_rate(m, k, n, device, args.repeat)
                    tensor = fp8_rate(m, k, n, device, args.repeat, rowwise=False)
                    row = fp8_rate(m, k, n, device, args.repeat, rowwise=True)
                    best = max(r for r in (tensor, row, 0.0) if r is not None)
                    rows.append((hidden, tp, m, linear, k, n, bf16, tensor, row))
                    fp8 = (f"{tensor / (2 * peak):10.3f} " if tensor else f"{'-':>10} ") + (
                        f"{row / (2 * peak):8.3f} " if row else f"{'-':>8} ")
                    print(f"{hidden:6} {tp:3} {m:6} {linear:>9} {k:6} {n:6} | {bf16 / peak:6.3f} {fp8}"
                          f"{best / bf16 if best else float('nan'):8.2f}", flush=True)
    # the FLOP-weighted mean per (hidden, tp, tokens): what one efficiency would have to stand for
    print("\nFLOP-weighted bf16 efficiency of a block's linears (rows: hidden / tp, columns: tokens)")
    print(f"{'':>12} " + " ".join(f"{m:>8}" for m in tokens))
    for hidden in widths:
        for tp in tps:
            cells = []
            for m in tokens:
                mine = [r for r in rows if r[0] == hidden and r[1] == tp and r[2] == m]
                flops = sum(2 * m * r[4] * r[5] for r in mine)
                seconds = sum(2 * m * r[4] * r[5] / r[6] for r in mine)
                cells.append(f"{flops / seconds / peak:8.3f}")
            print(f"{hidden:>6} / tp{tp:<3} " + " ".join(cells))


if __name__ == "__main__":
    main()
