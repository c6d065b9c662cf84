"""Real gloo processes under torchrun, for what only real processes show: each pipelining schedule
(PipelineStage sends and receives, its shape checks), tp groups inside a pipeline, and DDP over the
dp axis (with its bucketed all-reduce, no_sync, BatchNorm buffers per replica); the 3D mesh with
tied-weight groups per (dp, tp) is tests/test_fsdp.py's dp2 x pp2 x tp2 with FSDP and AdamW. Each
run trains and matches the untouched model: step 1's loss, output and every rank's gradient against
the matching slice of the original gradient; the loss of every step.

Model variety is checked in one process (the local backend runs every stage and every tp shard, a
thread per tp rank, with the same collectives): tests/test_equivalence_local.py (each example at
pp 2, pp 4, interleaved) and tests/test_local_tp.py (gpt, llama, bert, mlp at tp 2, tp 2 x pp 2, tp 4).
"""

import pytest

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training

from .conftest import EXAMPLES, MODELS

pytestmark = pytest.mark.slow

CASES = [
    # each schedule once, on models whose stages pass several tensors (unet's skip connections,
    # last_input's model input carried to the last stage) and BatchNorm buffers (resnet)
    # (1F1B, the default: tests/test_weights.py's tensor x pipeline run)
    ("unet.py", Plan(pp=3, schedule="gpipe")),  # batch 4: the default gives 4 micro-batches, not one per stage
    # interleaved under DDP; BatchNorm: each replica keeps its own statistics (no buffer broadcast)
    ("resnet.py", Plan(dp=2, pp=2, schedule="interleaved-1f1b", stages_per_rank=2)),
    ("last_input.py", Plan(pp=2, schedule="looped-bfs", stages_per_rank=2, microbatches=4)),
    # zero bubble, V placement: rank 0 holds stages 0 and 3, so gpt's tied embedding and LM head share a
    # rank; torch's split backward (input gradients, weight gradients later) on stages cut mid-block;
    # plain dp without DDP (autograd.grad fires none of its hooks): gradients averaged after the step
    ("gpt.py", Plan(dp=2, pp=2, schedule="zbv", stages_per_rank=2)),
    # zero bubble under FSDP in bf16 with whole-stage recompute at tp 2: the cut falls after a norm weight's
    # fp32 cast, which the next stage recomputes from its own copy (sent, it lost its weight gradient)
    ("llama.py", Plan(dp=2, pp=2, tp=2, schedule="zero-bubble", stages_per_rank=2, fsdp=True, autocast="bf16",
                      checkpoint="stage")),
    # tensor x pipeline with activation checkpointing: tests/test_weights.py's run from a weights file
    # data parallel: DDP over the dp axis, each replica its share of the batch, gradients averaged
    # (tied embeddings synced per replica: test_parallelize's FSDP dp2 x pp2 x tp2 gpt)
    ("mlp.py", Plan(dp=2)),  # one stage: DDP without a schedule (no_sync on all but the last micro-batch)
    # HF's BLOOM as is, tp 2 with sequence parallelism under bf16: ALiBi's bias cut chunk by chunk over the
    # merged batch x heads dim into baddbmm (all its inputs cast to bf16), its GeLUFunction keeping the shard
    ("hf_bloom.py", Plan(tp=2, sequence_parallel=True, autocast="bf16")),
    # nanoGPT's own loss in its forward over vocab-sharded logits (the vocab-parallel cross-entropy), under DDP
    ("outside/nanogpt_tiny.py", Plan(dp=2, tp=2)),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n.removesuffix('.py')}-dp{p.dp}-pp{p.pp}-tp{p.tp}-{p.schedule}-{p.checkpoint}" for n, p in CASES])
def test_torchrun_training_matches_untouched_model(name, plan):
    path = EXAMPLES / name if (EXAMPLES / name).exists() else MODELS / name
    lines: list[str] = []
    cmp = run_training(str(path), plan, RunOptions(steps=3, check=True, timeout_s=240), echo=lines.append)
    assert cmp is not None
    assert cmp.ok, "\n".join(lines)
    assert any("rank" in k for k in cmp.max_diff), "gradients from the ranks were compared"
    assert lines[-1].startswith("check passed")
    # the reference is the whole batch, except where BatchNorm takes the statistics of each replica's micro-batch:
    # there the check says so and compares with the untouched model on those pieces
    batchnorm = name == "resnet.py"
    assert any(line.startswith("  note: BatchNorm stem.1") for line in lines) == batchnorm, lines
    assert any("untouched model in one process on the whole global batch" in line for line in lines) != batchnorm
    # each rank ran the model's constructor keeping only its own parameters (runtime/exact_init.py)
    assert any("keeping only its own parameters" in line for line in lines)
