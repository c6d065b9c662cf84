"""Real gloo processes under torchrun: every example at pp 2 and 4 and each schedule,
and at tp 2 and 4 and tp 2 x pp 2, trains and matches the untouched model (step 1's
loss, output and every rank's gradient against the matching slice of the original
gradient; the loss of every step)."""

import pytest

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training

from .conftest import EXAMPLES, MODELS

pytestmark = pytest.mark.slow

CASES = [
    # (model, plan): each example at pp 2 and pp 4; the schedules rotate over them
    ("gpt.py", Plan(pp=2, schedule="gpipe")),
    ("gpt.py", Plan(pp=4, schedule="1f1b")),
    ("gpt.py", Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2)),
    ("unet.py", Plan(pp=2, schedule="1f1b")),
    ("unet.py", Plan(pp=4, schedule="gpipe")),
    ("resnet.py", Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2)),
    ("resnet.py", Plan(pp=4, schedule="1f1b")),
    ("mlp.py", Plan(pp=2, schedule="1f1b")),
    ("mlp.py", Plan(pp=4, schedule="looped-bfs", stages_per_rank=2, microbatches=8)),
    ("last_input.py", Plan(pp=4, schedule="1f1b")),
    # tensor parallel, and tensor x pipeline (world = pp x tp)
    ("gpt.py", Plan(tp=2)),
    ("gpt.py", Plan(tp=4)),
    ("gpt.py", Plan(tp=2, pp=2)),
    ("llama.py", Plan(tp=2)),
    ("llama.py", Plan(tp=4)),  # 2 kv heads over 4 ranks: replicated and sliced per rank
    ("llama.py", Plan(tp=2, pp=2, schedule="gpipe")),
    ("bert.py", Plan(tp=2)),
    ("bert.py", Plan(tp=4)),
    ("bert.py", Plan(tp=2, pp=2)),
    ("mlp.py", Plan(tp=2)),  # an MSE loss: the output is gathered, not kept sharded
    # data parallel: each replica trains on its share of the batch, gradients averaged
    ("mlp.py", Plan(dp=2)),
    ("gpt.py", Plan(dp=2, pp=2)),
    ("resnet.py", Plan(dp=2, pp=2)),  # BatchNorm sees the same micro-batches as the reference
    ("llama.py", Plan(dp=2, tp=2)),
    # activation checkpointing around tp collectives and across pipeline stages
    ("gpt.py", Plan(tp=2, pp=2, checkpoint="blocks")),
    ("llama.py", Plan(pp=2, checkpoint="selective")),
    # bf16 autocast: loss and outputs within bf16 tolerance of fp32
    ("gpt.py", Plan(tp=2, pp=2, autocast="bf16")),
]
THREE_D = [("gpt.py", Plan(dp=2, pp=2, tp=2)), ("llama.py", Plan(dp=2, pp=2, tp=2))]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n.removesuffix('.py')}-dp{p.dp}-pp{p.pp}-tp{p.tp}-{p.schedule}-{p.checkpoint}-{p.autocast}" for n, p in CASES])
def test_torchrun_training_matches_untouched_model(name, plan):
    path = EXAMPLES / name if (EXAMPLES / name).exists() else MODELS / name
    lines: list[str] = []
    cmp = run_training(str(path), plan, RunOptions(steps=3, check=True, timeout_s=240), echo=lines.append)
    assert cmp is not None
    assert cmp.ok, "\n".join(lines)
    assert any("rank" in k for k in cmp.max_diff), "gradients from the ranks were compared"
    assert lines[-1].startswith("check passed")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, plan", THREE_D, ids=[n.removesuffix(".py") for n, _ in THREE_D])
def test_3d_world_of_8_trains_like_one_process_with_adamw(name, plan):
    """dp2 x pp2 x tp2 on 8 gloo processes, 5 AdamW steps: the loss curve of the untouched model."""
    lines: list[str] = []
    opts = RunOptions(steps=5, optimizer="adamw", lr=1e-3, check=True, timeout_s=240)
    cmp = run_training(str(EXAMPLES / name), plan, opts, echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("5 steps" in line for line in lines)
