"""`graphsplit run` as a trainer: AdamW, lr schedules, global gradient clipping, train_data() and
eval_data(), per-step metrics, and several nodes.

Unit tests (no process started): the lr factors, the global gradient norm's arithmetic over tp
shards, tp-replicated parameters and tied copies (the local backend's tp ranks in threads), the
data each dp replica gets, and bad input as one line. One real-process test: two "nodes" on
127.0.0.1 train dp2 x pp2 on train_data() with clipping, a cosine schedule and AdamW, checkpoint
half-way, and a one-node run resumed from there under --check continues exactly.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DistributedSampler

from graphsplit import Plan
from graphsplit.backends.local import LocalProgram
from graphsplit.cli import main
from graphsplit.ir.sharding import shard_tensor
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.reference import reference_run, reference_step
from graphsplit.launch.run_check import UPDATE_RTOL, check_weights_after, weight_tolerance
from graphsplit.launch.tolerance import Precision
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.clip import global_norm_and_clip, owned_grads, squared_norm_share
from graphsplit.runtime.data import DataSource
from graphsplit.runtime.materialize import model_tensors
from graphsplit.runtime.schedule import lr_factor, make_scheduler
from graphsplit.runtime.training import OptimConfig

from .conftest import EXAMPLES, MODELS

WITH_DATA = str(MODELS / "with_data.py")


# -- lr schedules ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, warmup, total, factors", [
    ("constant", 0, 4, [1, 1, 1, 1]),
    ("constant", 2, 4, [1 / 3, 2 / 3, 1, 1]),
    ("linear", 0, 4, [1, 0.75, 0.5, 0.25]),
    ("linear", 1, 5, [0.5, 1, 0.75, 0.5, 0.25]),
    ("cosine", 0, 4, [1, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2]),
    ("cosine", 1, 3, [0.5, 1, 0.5]),
])
def test_lr_factors(schedule, warmup, total, factors):
    assert [lr_factor(schedule, s, warmup, total) for s in range(total)] == pytest.approx(factors)


def test_a_resumed_scheduler_gives_the_lrs_of_an_uninterrupted_one():
    def lrs(done: int, steps: int) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        scheduler = make_scheduler(opt, "cosine", 2, 6, done)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            scheduler.step()
        return out

    whole = lrs(0, 6)
    assert whole[:3] == pytest.approx([0.1 / 3, 0.2 / 3, 0.1]) and whole[-1] > 0
    assert lrs(3, 3) == pytest.approx(whole[3:])


# -- the global gradient norm -------------------------------------------------------------------------

def test_the_global_norm_counts_each_parameter_once_across_tp_shards_and_tied_copies():
    """gpt at tp2 x pp2 (local backend, tp ranks in threads): its tied embedding sits on both stages,
    layer norms are replicated on both tp ranks, attention and MLP weights are sharded. The ranks'
    shares sum to clip_grad_norm_'s norm on the untouched model, and clipping on every rank gives each
    rank the slice of the untouched model's clipped gradient."""
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    program = rewrite_loaded(loaded, Plan(tp=2, pp=2)).program
    assert program.shared_params and program.param_shardings
    model = loaded.build("cpu", seed=0)
    local = LocalProgram(program, model_tensors(model), loaded.loss_fn)
    local.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn)  # the whole batch
    want = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # clips the reference's gradients too
    stages = [dict(enumerate(rank.stages)) for rank in local.ranks]

    shares = [squared_norm_share(owned_grads(program, s, tp_rank, 0, False)) for tp_rank, s in enumerate(stages)]
    total = sum(shares)
    assert float(total.sqrt()) == pytest.approx(float(want), rel=1e-5)
    # counting every tensor each rank holds would count the tied copy and the replicated norms twice
    naive = sum(float(g.float().square().sum()) for s in stages for m in s.values() for p in m.parameters()
                if (g := p.grad) is not None)
    assert naive > float(total) * 1.01
    # a DDP replica other than 0 owns nothing (replica 0 speaks for it); an FSDP replica owns its shard
    assert owned_grads(program, stages[0], 0, 1, False) == []
    assert len(owned_grads(program, stages[0], 0, 1, True)) == len(owned_grads(program, stages[0], 0, 0, False))

    for tp_rank, s in enumerate(stages):
        norm = global_norm_and_clip(program, s, tp_rank, 0, False, 0.05, lambda t: t.copy_(total))
        assert norm == pytest.approx(float(want), rel=1e-5)
        for index, module in s.items():
            for local_name, canonical in program.stages[index].param_sources.items():
                expected = shard_tensor(model.get_parameter(canonical).grad, program.param_sharding(canonical), tp_rank, 2)
                torch.testing.assert_close(module.get_parameter(local_name).grad, expected, rtol=1e-5, atol=1e-8,
                                           msg=canonical)


def test_the_reference_run_clips_and_schedules():
    """The --check reference on the untouched model: norms before clipping, and with a max norm this
    small every step's update is the clipped one."""
    loaded = load_model(WITH_DATA)
    config = OptimConfig("adamw", 0.01, weight_decay=0.1, betas=(0.9, 0.95), lr_schedule="cosine",
                         warmup_steps=1, grad_clip=0.05)
    ref = reference_run(loaded.build("cpu", seed=0), loaded, Plan(dp=2, pp=2, microbatches=2), 3, config,
                        train_data=True, eval_every=3)
    assert all(n > 0.05 for n in ref.norms) and len(ref.losses) == 3 and set(ref.eval_losses) == {3}
    assert len(set(ref.losses)) == 3  # distinct batches, distinct losses


def test_the_weight_check_compares_every_rank_s_update_and_fails_on_a_missing_dump(tmp_path):
    """--check's last comparison: each rank's weights after the run against the untouched model's, as
    updates from the weights before the run (relative error: a weight near 1 moved by 1e-3 is measured
    against the 1e-3, not the 1)."""
    loaded = load_model(WITH_DATA)
    program = rewrite_loaded(loaded, Plan(pp=2)).program
    model = loaded.build("cpu", seed=0)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():  # the reference's training: some update of every weight
        for p in model.parameters():
            p.sub_(1e-3 * torch.randn_like(p))
    after = {n: p.detach().clone() for n, p in model.named_parameters()}

    def dump(weights: dict[str, torch.Tensor], ranks=(0, 1)) -> None:
        for f in tmp_path.glob("weights*.pt"):
            f.unlink()
        for r in ranks:
            mine = set(program.stages[r].param_sources.values())
            torch.save({k: v for k, v in weights.items() if k in mine}, tmp_path / f"weights{r}.pt")

    sgd = adamw = weight_tolerance()  # whatever the optimizer
    assert sgd == UPDATE_RTOL == 1e-2 and weight_tolerance(Precision("bf16")) == 1e-2
    dump(after)
    healthy = check_weights_after(program, tmp_path, model, initial, sgd)
    assert healthy.ok and len(healthy.max_diff) == len(after), healthy.failures
    last = [k for k in after if k in set(program.stages[1].param_sources.values())][0]
    wrong = {**after, last: initial[last] + 0.9 * (after[last] - initial[last])}  # one tensor's update 10% short
    dump(wrong)
    for rtol in (sgd, adamw):
        cmp = check_weights_after(program, tmp_path, model, initial, rtol)
        assert [f.split(" after")[0] for f in cmp.failures] == [f"rank 1: weight {last}"], cmp.failures
    dump(after, ranks=(0,))  # rank 1 wrote nothing: its weights are not compared, and that fails
    cmp = check_weights_after(program, tmp_path, model, initial, sgd)
    assert "rank(s) [1] wrote none" in cmp.failures[0] and "no rank holds" in cmp.failures[1], cmp.failures


# -- data ---------------------------------------------------------------------------------------------

def _rows(batch) -> list[tuple[float, ...]]:
    return [tuple(r.tolist()) for r in batch.args[0]]


def test_each_dp_replica_gets_its_distributed_sampler_share_of_every_global_batch():
    loaded = load_model(WITH_DATA)
    dataset = loaded.train_data()
    source = DataSource("train_data", loaded.train_data, (loaded.args, loaded.kwargs), seed=7)
    steps = 7  # 5 batches an epoch: crosses into the second, reshuffled epoch
    sets = {}
    for dp in (1, 2, 4):
        shares = [list(zip(range(steps), source.batches(dp, d))) for d in range(dp)]
        for d in range(dp):  # what DistributedSampler gives replica d, batched by global batch / dp
            sampler = DistributedSampler(dataset, num_replicas=dp, rank=d, shuffle=True, seed=7, drop_last=True)
            expected = []
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                order = list(sampler)
                expected += [order[i:i + 8 // dp] for i in range(0, len(order) // (8 // dp) * (8 // dp), 8 // dp)]
            for k, batch in shares[d]:
                assert torch.equal(batch.args[0], dataset.x[expected[k]])
                assert torch.equal(batch.target, dataset.y[expected[k]])
        for k in range(steps):
            rows = [r for d in range(dp) for r in _rows(shares[d][k][1])]
            assert len(set(rows)) == 8  # the replicas' shares are disjoint and fill the global batch
            sets.setdefault(k, []).append(frozenset(rows))
    # global batch k is the same set of samples at any dp; each batch of the first epoch is new
    assert all(len(set(v)) == 1 for v in sets.values())
    assert len({v[0] for k, v in sets.items() if k < 5}) == 5
    # starting at batch 3 continues exactly: what a resumed run draws
    again = source.batches(2, 1, start=3)
    for k in range(3, steps):
        assert _rows(next(again)) == _rows(list(zip(range(steps), source.batches(2, 1)))[k][1])


def test_an_iterable_gives_each_replica_a_contiguous_slice_and_restarts_each_epoch():
    calls = []

    def train_data():
        calls.append(1)
        return (((torch.arange(8.0 * k, 8.0 * k + 8).reshape(8, 1).expand(8, 8).clone(),), torch.zeros(8, 8))
                for k in range(3))

    source = DataSource("train_data", train_data, ((torch.zeros(8, 8),), {}))
    got = [b.args[0][:, 0].tolist() for b, _ in zip(source.batches(2, 1, start=2), range(3))]
    assert got == [[20.0, 21, 22, 23], [4.0, 5, 6, 7], [12.0, 13, 14, 15]]  # batch 2, then epoch 2's 0 and 1
    assert len(calls) == 2  # the first epoch read the call the constructor made, the second called again
    merged = next(source.global_batches(2))  # the reference: the batch as given, from a new call
    assert merged.args[0][:, 0].tolist() == list(range(8)) and len(calls) == 3


# -- bad input ------------------------------------------------------------------------------------------

HEADER = f"import sys\nsys.path.insert(0, {str(MODELS)!r})\nimport torch\nfrom with_data import *  # noqa\n\n\n"
BAD_DATA = {
    "tensors_only.py": HEADER + "def train_data():\n    return [torch.zeros(8, 8)]\n",
    "wrong_shape.py": HEADER + "def train_data():\n    return [((torch.zeros(8, 5),), torch.zeros(8, 8))]\n",
    "raises.py": HEADER + "def train_data():\n    raise ValueError('no such file: corpus.bin')\n",
    "not_iterable.py": HEADER + "def train_data():\n    return 42\n",
    "too_small.py": HEADER + "def train_data():\n    return Pairs(5)\n",
    "empty.py": HEADER + "def train_data():\n    return []\n",
}
T = WITH_DATA
BAD_ROWS = [
    ("grad-clip-0", [T, "--grad-clip", "0"], r"--grad-clip must be a positive number, got 0"),
    ("grad-clip-negative", [T, "--grad-clip", "-1"], r"--grad-clip must be a positive number, got -1"),
    ("warmup-over-steps", [T, "--steps", "2", "--warmup-steps", "3"], r"--warmup-steps 3 is more than the run's 2 steps"),
    ("warmup-negative", [T, "--warmup-steps", "-1"], r"--warmup-steps must be at least 0"),
    ("betas-with-sgd", [T, "--betas", "0.9,0.95"], r"--betas applies to --optimizer adamw only"),
    ("betas-one-number", [T, "--optimizer", "adamw", "--betas", "0.9"], r"--betas takes two numbers"),
    ("betas-out-of-range", [T, "--optimizer", "adamw", "--betas", "0.9,1.5"], r"--betas must be two numbers in \[0, 1\)"),
    ("weight-decay-negative", [T, "--weight-decay", "-0.1"], r"--weight-decay must be a non-negative number"),
    ("eval-without-eval-data", [str(MODELS / "tiny.py"), "--eval-every", "1"], r"--eval-every needs eval_data\(\) in .*tiny\.py"),
    ("data-tensors-only", ["{d}/tensors_only.py"],
     r"train_data\(\) batch 0 is a tensor of shape \(8, 8\); each batch must be a pair \(inputs, target\)"),
    ("data-wrong-shape", ["{d}/wrong_shape.py"], r"train_data\(\) batch 0: input 0 is \(8, 5\) torch.float32, expected \(8, 8\)"),
    ("data-raises", ["{d}/raises.py"], r"train_data\(\) failed: ValueError: no such file: corpus\.bin"),
    ("data-not-iterable", ["{d}/not_iterable.py"], r"train_data\(\) returned int; return an iterable"),
    ("data-too-small", ["{d}/too_small.py"], r"a dataset of 5 samples, fewer than one global batch of 8"),
    ("data-empty", ["{d}/empty.py"], r"train_data\(\) gave no batch"),
    ("nnodes-without-endpoint", [T, "--nnodes", "2"], r"--nnodes > 1 needs --rdzv-endpoint HOST:PORT"),
    ("nodes-do-not-make-the-world", [T, "--pp", "2", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                                     "127.0.0.1:29999"], r"the plan needs 2 processes but --nnodes 2 x --nproc-per-node 2 = 4"),
    ("node-rank-out-of-range", [T, "--pp", "2", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29999"],
     r"--node-rank must be in 0\.\.1"),
    ("check-on-two-nodes", [T, "--pp", "2", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999", "--check"],
     r"--check .* runs on one node"),
]


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad_data")
    for name, text in BAD_DATA.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("argv, pattern", [(r[1], r[2]) for r in BAD_ROWS], ids=[r[0] for r in BAD_ROWS])
def test_bad_trainer_input_is_one_line(bad_data, monkeypatch, argv, pattern):
    import graphsplit.launch.launcher as launcher

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input reached torchrun")

    monkeypatch.setattr(launcher, "_launch", refuse)
    result = CliRunner().invoke(main, ["run", *(a.replace("{d}", str(bad_data)) for a in argv)])
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert re.search(pattern, lines[0]), lines[0]


def test_print_command_prints_torchrun_and_starts_nothing(monkeypatch):
    import graphsplit.launch.launcher as launcher

    monkeypatch.setattr(launcher, "_launch", lambda *a, **k: pytest.fail("--print-command launched"))
    result = CliRunner().invoke(main, ["run", WITH_DATA, "--pp", "2", "--nnodes", "2", "--node-rank", "1",
                                       "--rdzv-endpoint", "10.0.0.1:29400", "--print-command"])
    assert result.exit_code == 0, result.output
    command = result.stdout.splitlines()[-1].split()
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--node-rank=1", "--nproc-per-node=1", "--rdzv-backend=static",
            "--rdzv-endpoint=10.0.0.1:29400"} <= set(command)
    spec = Path(command[-1])
    try:
        assert json.loads(spec.read_text())["train_data"] is True  # kept for the command to run
    finally:
        shutil.rmtree(spec.parent)


# -- tensorboard --------------------------------------------------------------------------------------

def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard folder, by tag: [(step, value)], as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _assert_scalars_are_the_metrics(folder: Path, rows: list[dict]) -> None:
    from graphsplit.launch.tensorboard import TAGS

    scalars = _scalars(folder)
    keys = {k for r in rows for k in r if k in TAGS}
    assert set(scalars) == {TAGS[k] for k in keys}
    for key in keys:
        want = [(r["step"], r[key]) for r in rows if key in r]
        got = scalars[TAGS[key]]
        assert [s for s, _ in got] == [s for s, _ in want], key  # one scalar per step
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), key  # float32 in the file


def test_the_step_log_writes_each_metrics_line_as_tensorboard_scalars(tmp_path):
    from graphsplit.launch.metrics import StepLog

    echoed: list[str] = []
    log = StepLog(str(tmp_path / "m.jsonl"), "tokens", 64, torch.device("cpu"), echo=echoed.append,
                  tensorboard=str(tmp_path / "tb"))
    log.step(1, 2.5, 0.01, 1.5, 0.25)
    log.step(2, 2.25, 0.005, float("inf"), 0.5, skipped=True)  # an fp16 overflow: no grad_norm point
    log.step(3, 2.0, 0.0025, 0.75, 0.125, clipped=True, eval_loss=2.125)
    log.close()
    rows = _metrics(tmp_path / "m.jsonl")
    assert rows[1]["grad_norm"] is None and len(echoed) == 3
    _assert_scalars_are_the_metrics(tmp_path / "tb", [{k: v for k, v in r.items() if v is not None} for r in rows])
    assert [s for s, _ in _scalars(tmp_path / "tb")["train/grad_norm"]] == [1, 3]
    assert _scalars(tmp_path / "tb")["eval/loss"] == [(3, 2.125)]


def test_tensorboard_without_the_package_is_one_line_and_launches_nothing(monkeypatch, tmp_path):
    import graphsplit.launch.launcher as launcher

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    monkeypatch.setattr(launcher, "_launch", lambda *a, **k: pytest.fail("launched without tensorboard"))
    monkeypatch.setattr(launcher, "load_model", lambda *a, **k: pytest.fail("loaded the model first"))
    result = CliRunner().invoke(main, ["run", WITH_DATA, "--tensorboard", str(tmp_path / "tb")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "pip install 'graphsplit[tensorboard]'" in lines[0], result.output
    assert lines[0].startswith("error: --tensorboard needs the tensorboard package")
    assert not (tmp_path / "tb").exists()


# -- moving batches to the device ---------------------------------------------------------------------------

def test_batches_are_pinned_and_copied_asynchronously_only_onto_a_gpu(monkeypatch):
    """No GPU here: torch.Tensor's pin_memory and to are recorded, not run, for the CUDA case."""
    from graphsplit.runtime.transfer import to_device

    calls: list[tuple] = []
    real_to = torch.Tensor.to

    def pin(t):
        calls.append(("pin", tuple(t.shape)))
        return t

    def to(t, *args, **kwargs):
        calls.append(("to", tuple(t.shape), str(args[0]), kwargs.get("non_blocking", False)))
        return t if str(args[0]).startswith("cuda") else real_to(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    batch = ((torch.ones(2, 3), {"mask": torch.ones(2, dtype=torch.bool)}), torch.zeros(2), 7)

    moved = to_device(batch, torch.device("cpu"))
    assert moved[0][0] is batch[0][0] and moved[2] == 7
    assert all(c[0] != "pin" for c in calls) and all(not c[3] for c in calls)  # nothing pinned on CPU

    calls.clear()
    moved = to_device(batch, torch.device("cuda", 1))
    assert calls == [("pin", (2, 3)), ("to", (2, 3), "cuda:1", True), ("pin", (2,)), ("to", (2,), "cuda:1", True),
                     ("pin", (2,)), ("to", (2,), "cuda:1", True)]
    assert moved[2] == 7


# -- real processes ---------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_nodes_train_on_data_and_a_resume_from_the_middle_continues_exactly(tmp_path):
    """Two launches on 127.0.0.1 (nodes 0 and 1, 2 processes each) train dp2 x pp2 on train_data()
    with AdamW (weight decay, betas), a cosine schedule with warm-up, --grad-clip small enough to
    clip every step, and eval_data() every 2 steps, checkpointing at step 2. Their metrics are the
    untouched model's, step by step. A one-node run resumed from step 2 under --check passes, and
    its steps 3-4 are the uninterrupted run's: the data position came back from the checkpoint."""
    optim = ["--optimizer", "adamw", "--weight-decay", "0.1", "--betas", "0.9,0.95", "--lr-schedule", "cosine",
             "--warmup-steps", "1", "--grad-clip", "0.05", "--eval-every", "2", "--timeout", "200"]
    common = [sys.executable, "-m", "graphsplit", "run", WITH_DATA, "--dp", "2", "--pp", "2", *optim]
    nodes = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"]
    first = [*common, "--steps", "4", "--save", "ck", "--save-every", "2", "--keep-last", "0", "--metrics", "m.jsonl",
             "--tensorboard", "tb", *nodes]
    launches = [subprocess.Popen([*first, "--node-rank", str(r)], cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in launches]
    finally:
        for p in launches:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in launches] == [0, 0], "\n".join(outs)
    assert "node 1 of 2" in outs[1] and "saved step 2" in outs[0]
    rows = _metrics(tmp_path / "m.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # one line per step, from the one rank holding the loss
    for r in rows:
        assert {"loss", "lr", "grad_norm", "samples_per_second", "step_seconds", "max_memory_bytes"} <= set(r)
        assert r["clipped"] and r["grad_norm"] > 0.05 and r["samples_per_second"] > 0 and r["max_memory_bytes"] > 0
    assert [("eval_loss" in r) for r in rows] == [False, True, False, True]
    _assert_scalars_are_the_metrics(tmp_path / "tb", rows)  # from the same rank: one event file
    assert len(list((tmp_path / "tb").iterdir())) == 1

    loaded = load_model(WITH_DATA)
    config = OptimConfig("adamw", 0.01, weight_decay=0.1, betas=(0.9, 0.95), lr_schedule="cosine",
                         warmup_steps=1, grad_clip=0.05)
    ref = reference_run(loaded.build("cpu", seed=0), loaded, Plan(dp=2, pp=2, microbatches=2), 4, config,
                        train_data=True, eval_every=2)
    assert [r["loss"] for r in rows] == pytest.approx(ref.losses, rel=1e-5)
    assert [r["grad_norm"] for r in rows] == pytest.approx(ref.norms, rel=1e-5)
    assert [r["lr"] for r in rows] == pytest.approx([0.01 * lr_factor("cosine", s, 1, 4) for s in range(4)])
    assert [rows[1]["eval_loss"], rows[3]["eval_loss"]] == pytest.approx([ref.eval_losses[2], ref.eval_losses[4]], rel=1e-5)

    # resumed in this process's launcher (one torch import fewer), on one node, under --check
    lines: list[str] = []
    opts = RunOptions(steps=2, optimizer="adamw", lr=0.01, optim={k: v for k, v in vars(config).items()
                                                                  if k not in ("optimizer", "lr")},
                      resume=str(tmp_path / "ck" / "step-2"), metrics=str(tmp_path / "m2.jsonl"), eval_every=2,
                      check=True, timeout_s=200)
    cmp = run_training(WITH_DATA, Plan(dp=2, pp=2), opts, echo=lines.append)
    out = "\n".join(lines)
    assert cmp is not None and cmp.ok, out
    assert "resuming at batch 2" in out and "check passed" in out, out
    assert re.search(r"grad norm +2 steps", out) and re.search(r"weights +after step 4: 16 tensors", out), out
    after = _metrics(tmp_path / "m2.jsonl")
    assert [r["step"] for r in after] == [3, 4]
    for key in ("loss", "grad_norm", "lr", "eval_loss"):
        got, want = [r.get(key) for r in after], [r.get(key) for r in rows[2:]]
        # steps without an eval loss hold None: the same steps must miss it, the others agree
        assert [v is None for v in got] == [v is None for v in want], key
        assert [v for v in got if v is not None] == pytest.approx([v for v in want if v is not None], rel=1e-6), key
