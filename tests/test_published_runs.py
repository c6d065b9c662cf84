"""bench/published_runs.py: the published runs the planner is checked against are well formed (each layout
a plan on the published number of GPUs, its batch cut in whole micro-batches), and one is priced with the
fields it published kept and only what it left open chosen."""

from __future__ import annotations

import math
import sys

import pytest

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import published_runs as published  # noqa: E402

MEGATRON_GPUS = {"1.7B": 48, "7.1B": 96, "16B": 192, "32B": 384, "70B": 768, "119B": 1536, "177B": 2304,
                 "314B": 3072, "462B": 6144}  # the README's table


def test_at_least_fifteen_runs_from_four_systems_each_with_its_source():
    runs = published.RUNS
    assert len(runs) >= 15 and len({r.system for r in runs}) >= 4
    for run in runs:
        assert run.source and run.published > 0 and run.unit in (
            "tokens/s/GPU", "TFLOP/s/GPU (Megatron)", "TFLOP/s/GPU (model)", "s/step"), run
        replicas = run.layout.dp // run.layout.cp
        assert run.batch % replicas == 0, run
        if run.micro_batch:
            assert (run.batch // replicas) % run.micro_batch == 0, run
        if run.system == "Megatron-LM":
            assert run.gpus == MEGATRON_GPUS[run.name.split()[-1]], run


def test_megatrons_flops_per_token_is_its_formula():
    """Megatron's count (3 passes, 24h^2 + 4sh per layer forward, the logits 2hV) for GPT 1.7B at 4,096
    tokens and a 131,072 vocabulary, written out term by term."""
    shape = next(r.shape for r in published.RUNS if r.name == "GPT 1.7B")
    h, s, v, layers = 2048, 4096, 131072, 24
    assert (shape.hidden, shape.seq, shape.vocab, shape.layers) == (h, s, v, layers)
    per_token = 3 * (layers * (24 * h * h + 4 * s * h) + 2 * h * v)
    assert math.isclose(shape.megatron_flops_per_token(), per_token, rel_tol=1e-12)


@pytest.mark.timeout(300)
def test_a_run_is_priced_with_its_published_fields_kept():
    run = next(r for r in published.RUNS if r.name == "GPT 1.7B")
    result = published.price_run(run)
    assert result.estimate is not None and result.fits
    plan = result.estimate.plan
    for field in ("tp", "pp", "dp", "zero", "sequence_parallel", "autocast", "compile"):
        assert getattr(plan, field) == getattr(run.layout, field), field
    # the predicted throughput is the estimate's tokens per second per GPU in Megatron's FLOPs
    tokens = result.estimate.tokens_per_second / run.gpus
    assert math.isclose(result.predicted, tokens * run.shape.megatron_flops_per_token() / 1e12, rel_tol=1e-9)
    assert 0.2 < result.ratio < 5


@pytest.mark.timeout(300)
def test_a_site_is_priced_at_the_middle_of_its_stated_peak_each_end_beside():
    """torchtitan's H100s are a part no profile describes (96 GB HBM2e at 2.4 TB/s, 500 W, a peak it puts
    between the NVL's and the SXM5's): the profile with the memory it states, every rate scaled to the middle
    of its peak range, under a name of its own (the planner caches op times by the profile's name); the
    prediction at either end brackets the one at the middle."""
    from graphsplit.planner import load_hardware

    run = next(r for r in published.RUNS if r.site is not None and r.name == "Llama 3.1 8B FSDP" and r.gpus == 8)
    base = load_hardware("h100")
    hw = run.site.hardware(base)
    low, high = run.site.bf16_peak
    assert hw.memory_bandwidth == 2.4e12 and hw.memory_bytes == 96 * 10**9 and hw.name != base.name
    scale = (low + high) / 2 / base.peak_flops["bfloat16"]
    assert all(math.isclose(hw.peak_flops[k], base.peak_flops[k] * scale) for k in base.peak_flops)
    result = published.price_run(run)
    assert result.fits and result.bounds is not None
    slow, fast = result.bounds
    assert slow < result.predicted < fast
