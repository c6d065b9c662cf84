"""Your own training script: karpathy/nanoGPT's train.py, unchanged, moved onto `parallelize()` at pp 2 x tp 2
by examples/own_script/nanogpt_train.diff, trains as the unchanged script trains in one process.

The unchanged script is the reference: one process, its own data loader (a memmap of token ids, batches
drawn with `torch.randint`), its gradient accumulation, cosine LR schedule over `param_groups`, AdamW in two
weight-decay groups, gradient clipping, `estimate_loss` validation and checkpoints. The patched script runs
under torchrun on 4 processes, each seeded its own way as nanoGPT's DDP path seeds them (`1337 + rank`):
graphsplit must take rank 0's weights and rank 0's batches for the whole replica for the two to agree.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from .conftest import EXAMPLES, MODELS, exported_weights

pytestmark = pytest.mark.slow

NANOGPT = MODELS / "outside" / "nanogpt"
DIFF = EXAMPLES / "own_script" / "nanogpt_train.diff"
# a tiny GPT on CPU: fp32, no compile, gloo; 5 iterations of 2 accumulated micro-steps, eval at 0 and 4
CONFIG = ["--dataset=tiny", "--device=cpu", "--compile=False", "--dtype=float32", "--backend=gloo", "--n_layer=2",
          "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--gradient_accumulation_steps=2",
          "--eval_interval=4", "--eval_iters=2", "--max_iters=4", "--warmup_iters=2", "--lr_decay_iters=4",
          "--learning_rate=0.001", "--min_lr=0.0001", "--grad_clip=0.05"]


def _script_folder(folder: Path) -> Path:
    """nanoGPT's three files and a dataset of 64 token ids, as its data/ scripts write one."""
    folder.mkdir()
    for name in ("model.py", "train.py", "configurator.py"):
        shutil.copy(NANOGPT / name, folder / name)
    data = folder / "data" / "tiny"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 4000), ("val", 1000)):
        rng.integers(0, 64, n).astype(np.uint16).tofile(data / f"{split}.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 64}, f)
    return folder


def _run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def _losses(out: str) -> tuple[list[float], list[tuple[float, float]]]:
    train = [float(x) for x in re.findall(r"^iter \d+: loss (\S+),", out, re.M)]
    evals = [(float(a), float(b)) for a, b in re.findall(r"^step \d+: train loss (\S+), val loss (\S+)$", out, re.M)]
    return train, evals


def test_diff_is_short():
    """The move is a few lines: in each hunk of the diff the larger of the lines of code it removes and
    adds (a line changed counts once; comments and blank lines not)."""
    touched = 0
    for hunk in DIFF.read_text().split("\n@@")[1:]:
        code = [line for line in hunk.splitlines()[1:] if line[:1] in "+-" and line[1:].strip()
                and not line[1:].strip().startswith("#")]
        touched += max(sum(line[0] == "-" for line in code), sum(line[0] == "+" for line in code))
    assert 0 < touched <= 15, touched


def test_nanogpt_train_script_on_parallelize_trains_as_unchanged(tmp_path):
    ref = _script_folder(tmp_path / "ref")
    ref_out = _run([sys.executable, "train.py", *CONFIG], ref)

    ours = _script_folder(tmp_path / "ours")
    subprocess.run(["git", "apply", str(DIFF)], cwd=ours, check=True, timeout=30)
    # nanoGPT's DDP path is CUDA only (`torch.cuda.set_device`): on this CPU machine each rank uses the CPU,
    # the one change that is this test's, not the diff's
    text = (ours / "train.py").read_text()
    text = text.replace("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n", "    device = 'cpu'\n")
    (ours / "train.py").write_text(text)
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                "--local-ranks-filter=0", "train.py", *CONFIG], ours)

    assert "differed between ranks" in out  # each rank built its own model: rank 0's was taken
    train, evals = _losses(out)
    ref_train, ref_evals = _losses(ref_out)
    assert len(train) == len(ref_train) == 5 and len(evals) == len(ref_evals) == 2
    assert train == pytest.approx(ref_train, abs=2e-4)  # printed to 4 decimals
    assert [x for pair in evals for x in pair] == pytest.approx([x for pair in ref_evals for x in pair], abs=2e-4)

    # the checkpoint at step 4 (after 4 optimizer steps, every one clipped: the norm is over every rank's
    # shards) holds the weights the unchanged script saved
    expected = torch.load(ref / "out" / "ckpt.pt", map_location="cpu", weights_only=False)["model"]
    got = exported_weights(ours / "out" / "ckpt")
    assert set(expected) <= set(got)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=2e-6, msg=name)


def _untouched(seed: int) -> tuple[dict, dict]:
    """What the loop computes on the untouched model built by rank 0 (its seed), on whole batches."""
    sys.path.insert(0, str(EXAMPLES))
    import gpt  # noqa: PLC0415

    from .workers.own_loop import LR_MATRICES, LR_OTHERS, batches

    torch.manual_seed(seed)
    model = gpt.build_model()
    (x1, y1), (x2, y2) = batches(1, 0)
    with torch.no_grad():
        evaluated = gpt.loss_fn(model(x1), y1)
    losses = [gpt.loss_fn(model(x), y) for x, y in ((x1, y1), (x2, y2))]
    (0.5 * losses[0] + 0.5 * losses[1]).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    with torch.no_grad():
        for _, p in model.named_parameters():
            p -= (LR_MATRICES if p.dim() >= 2 else LR_OTHERS) * p.grad
    found = {"eval": evaluated, "losses": [0.5 * loss.detach() for loss in losses], "norm": norm}
    return found, {"grads": grads, "weights": {n: p.detach() for n, p in model.named_parameters()}}


# dp 2 x pp 2: the Lightning tests give each replica its first rank's batch the same way. FSDP at dp 2: a
# validation forward before training once left FSDP's root unit gathered, and the accumulated gradients wrong
@pytest.mark.parametrize("dp,pp,tp,fsdp", [(1, 2, 2, False), (2, 1, 1, True)])
def test_own_loop_on_parallelize_equals_untouched_model(tmp_path, dp, pp, tp, fsdp):
    """A DDP-style loop (a seed per rank, a batch per rank, its own optimizer in two groups, accumulation,
    clipping, validation) on `parallelize()`: every rank's losses, gradient shards, norm and weights are the
    untouched model's, built by rank 0 and trained on the replicas' whole batches."""
    from graphsplit import Plan
    from graphsplit.ir.sharding import shard_tensor
    from graphsplit.loader import load_model
    from graphsplit.rewrite import rewrite_loaded

    world = dp * pp * tp
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
          str(Path(__file__).parent / "workers" / "own_loop.py"), f"--dp={dp}", f"--pp={pp}", f"--tp={tp}",
          f"--out={tmp_path}", *(["--fsdp"] if fsdp else [])], tmp_path)
    scalars, tensors = _untouched(100)
    program = rewrite_loaded(load_model(str(EXAMPLES / "gpt.py")), Plan(dp=dp, pp=pp, tp=tp, fsdp=fsdp)).program
    seen: set[str] = set()
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        torch.testing.assert_close(got["eval"], scalars["eval"], rtol=1e-5, atol=1e-6)
        for loss, expected in zip(got["losses"], scalars["losses"]):  # on every rank, not only the last stage's
            torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["norm"], scalars["norm"], rtol=1e-5, atol=1e-6)
        assert all(got["groups"])  # both groups kept, each with this rank's parameters
        for kind in ("grads", "weights"):
            for name, value in got[kind].items():
                expected = shard_tensor(tensors[kind][name], program.param_sharding(name), got["tp_rank"], tp)
                torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {kind} {name}")
        seen |= set(got["grads"])
    assert seen == set(tensors["grads"]) - {"lm_head.weight"}  # tied to the embedding: one name
