"""Checkpoints: DCP with the original names, resharded on load, exported for the untouched model,
resumed with exactly the losses of an uninterrupted run, and never half-written."""

import contextlib
import os
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner
from safetensors.torch import load_file

from graphsplit import GraphsplitError, Plan
from graphsplit.cli import main
from graphsplit.ir.sharding import R, S, Shard, shard_tensor
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.reference import reference_step, reference_train
from graphsplit.loader import load_model
from graphsplit.runtime.dcp import blocks, record, safe_read, series
from graphsplit.runtime.dcp import state as dcp_state

from .conftest import EXAMPLES, MODELS, exported_weights, untouched_after_sgd_step

GPT = str(EXAMPLES / "gpt.py")


@pytest.mark.parametrize("sharding", [R, S(0), S(1), S(0, (6, 6, 6)), S(0, (8, 4, 4))])
@pytest.mark.parametrize("tp", [1, 2])
def test_every_rank_blocks_cover_the_whole_tensor_once(sharding, tp):
    full = torch.arange(18 * 4, dtype=torch.float32).reshape(18, 4) if not sharding.is_shard(1) else torch.randn(6, 8)
    if sharding.is_shard() and sharding.chunks:
        full = torch.randn(sum(sharding.chunks), 3)
    rebuilt = torch.full_like(full, float("nan"))
    seen: dict[tuple, torch.Tensor] = {}
    for rank in range(tp):
        local = shard_tensor(full, sharding, rank, tp).clone()
        pieces = blocks.pieces_of(local, sharding, rank, tp)
        assert pieces.size() == full.shape
        for offsets, block in pieces.blocks:
            if tuple(offsets) in seen:  # a replica: DCP stores one copy per (name, offsets)
                assert torch.equal(seen[tuple(offsets)], block)
                continue
            seen[tuple(offsets)] = block
            target = rebuilt
            for d, (o, n) in enumerate(zip(offsets, block.shape)):
                target = target.narrow(d, o, n)
            assert torch.isnan(target).all(), "two blocks overlap"
            target.copy_(block)
            assert block.data_ptr() >= local.data_ptr()  # views of the live tensor: a load writes through
    assert torch.equal(rebuilt, full)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("shape", [(17, 3), (17,)])
def test_a_padded_shard_hands_dcp_only_its_real_rows(tp, shape):
    """17 rows at tp 4 are blocks of 5, the last holding 2 real rows and 3 padding: the blocks
    cover the original tensor once, in its own shape, and no padding row is among them."""
    full = torch.randn(shape)
    sharding = Shard(0, size=17)
    rebuilt = torch.full_like(full, float("nan"))
    for rank in range(tp):
        local = shard_tensor(full, sharding, rank, tp).clone()
        pieces = blocks.pieces_of(local, sharding, rank, tp)
        assert pieces.size() == full.shape
        for offsets, block in pieces.blocks:
            target = rebuilt.narrow(0, offsets[0], block.shape[0])
            assert torch.isnan(target).all(), "two blocks overlap"
            target.copy_(block)
    assert torch.equal(rebuilt, full)


def _rank_pieces(tensor: torch.Tensor, sharding, tp: int) -> blocks.Pieces:
    """Every tp rank's blocks in one: what a tp run's ranks hand DCP together, written by one process."""
    parts = [blocks.pieces_of(shard_tensor(tensor, sharding, r, tp).clone(), sharding, r, tp) for r in range(tp)]
    return blocks.Pieces(parts[0].global_size, [b for p in parts for b in p.blocks])


def test_a_padded_checkpoint_loads_at_other_paddings_and_exports_original_shapes(tmp_path, one_process_group):
    """A vocabulary of 97 saved as tp 2 blocks of 49 (one padding row) loads as tp 4 blocks of 25
    (three padding rows) and whole; the padding is never read or written, export-weights gives (97, 8)."""
    weight, bias = torch.randn(97, 8), torch.randn(97)
    sharding = Shard(0, size=97)
    state = {"lm_head.weight": _rank_pieces(weight, sharding, 2), "lm_head.bias": _rank_pieces(bias, sharding, 2)}
    dcp_state.save_checkpoint(tmp_path / "c", state, step=1, record={"plan": {}, "aliases": {}})
    for rank in range(4):
        local_w, local_b = torch.full((25, 8), 7.0), torch.full((25,), 7.0)  # 7: what a load must not touch
        dcp_state.load_checkpoint(tmp_path / "c", {"lm_head.weight": blocks.pieces_of(local_w, sharding, rank, 4),
                                                  "lm_head.bias": blocks.pieces_of(local_b, sharding, rank, 4)}, False)
        real = 22 if rank == 3 else 25
        assert torch.equal(local_w[:real], weight[25 * rank:25 * rank + real])
        assert torch.equal(local_b[:real], bias[25 * rank:25 * rank + real])
        assert (local_w[real:] == 7.0).all() and (local_b[real:] == 7.0).all()
    whole = torch.zeros(97, 8)
    dcp_state.load_checkpoint(tmp_path / "c", {"lm_head.weight": whole}, False)
    assert torch.equal(whole, weight)
    names = dcp_state.export_weights(tmp_path / "c", tmp_path / "w.safetensors")
    exported = load_file(tmp_path / "w.safetensors")
    assert names == ["lm_head.bias", "lm_head.weight"] and exported["lm_head.weight"].shape == (97, 8)
    assert torch.equal(exported["lm_head.weight"], weight) and torch.equal(exported["lm_head.bias"], bias)


@pytest.fixture
def one_process_group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.HashStore()
    dist.init_process_group("gloo", rank=0, world_size=1, store=store, timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_a_crash_during_save_leaves_the_previous_checkpoint_whole(tmp_path, one_process_group, monkeypatch):
    weight = torch.randn(4, 3)
    state = {"lin.weight": blocks.pieces_of(weight, R, 0, 1)}
    target = tmp_path / "ckpt"
    dcp_state.save_checkpoint(target, state, step=3, record={"plan": {}})
    assert record.read_info(target)["step"] == 3

    real_save = dcp_state.dcp.save

    def crash_after_writing(*args, **kwargs):
        real_save(*args, **kwargs)  # the tensor files and .metadata are on disk...
        raise RuntimeError("killed")  # ...and the process dies before the record

    monkeypatch.setattr(dcp_state.dcp, "save", crash_after_writing)
    with pytest.raises(RuntimeError, match="killed"):
        dcp_state.save_checkpoint(target, {"lin.weight": blocks.pieces_of(weight + 1, R, 0, 1)}, step=4, record={"plan": {}})
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"], "no temporary folder is left behind"
    loaded = torch.zeros(4, 3)
    assert dcp_state.load_checkpoint(target, {"lin.weight": blocks.pieces_of(loaded, R, 0, 1)}, same_world=True) == 3
    assert torch.equal(loaded, weight)

    monkeypatch.setattr(dcp_state.dcp, "save", real_save)
    half = tmp_path / "half"
    half.mkdir()
    (half / ".metadata").write_bytes(b"")
    with pytest.raises(GraphsplitError, match="not a graphsplit checkpoint"):
        record.read_info(half)  # tensor files without the record are not a checkpoint


def test_loading_checks_names_and_shapes(tmp_path, one_process_group):
    dcp_state.save_checkpoint(tmp_path / "c", {"a": torch.ones(2, 2)}, step=1, record={})
    with pytest.raises(GraphsplitError, match="has no tensor 'b'"):
        dcp_state.load_checkpoint(tmp_path / "c", {"b": torch.ones(2, 2)}, same_world=True)
    with pytest.raises(GraphsplitError, match=r"shape \(2, 2\), the model has \(3, 2\)"):
        dcp_state.load_checkpoint(tmp_path / "c", {"a": torch.ones(3, 2)}, same_world=True)
    with pytest.raises(GraphsplitError, match="no optimizer state"):
        dcp_state.load_checkpoint(tmp_path / "c", {"a": torch.ones(2, 2), "optimizer/a/exp_avg": torch.ones(2, 2)}, True)


def _losses(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"step\s+(\d+)\s+loss (\S+)", text)}


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_checkpoint_reshards_to_another_plan_and_loads_into_the_untouched_model(tmp_path):
    """The GPT example with a tied vocabulary of 97: saved at tp 2 x pp 2 (a fused QKV in halves, the
    vocabulary in blocks of 49 with one padding row), resumed at tp 4 (QKV quarters, blocks of 25 with
    three padding rows); each checkpoint exports to the model's own names and shapes."""
    spec = str(MODELS / "odd_vocab.py")
    # SGD: one AdamW step turns gradients of 1e-10 into updates of lr, so values after it are not comparable
    common = dict(optimizer="sgd", lr=0.01, timeout_s=300)
    run_training(spec, Plan(tp=2, pp=2), RunOptions(steps=1, save=str(tmp_path / "a"), **common), echo=print)
    a = exported_weights(tmp_path / "a")

    loaded, reference, optimizer = untouched_after_sgd_step(spec, 0.01)  # on the whole batch
    model = loaded.build("cpu", seed=0)
    # the original names (tied aliases included) and shapes: no padding row in the file
    assert {k: tuple(v.shape) for k, v in a.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert a["wte.weight"].shape == (97, 64) and torch.equal(a["wte.weight"], a["lm_head.weight"])
    model.load_state_dict(a, strict=True)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), p, rtol=1e-5, atol=1e-5, msg=name)

    # resumed at another plan (tp2 x pp2 blocks read by tp4 x pp1 ranks: a fused QKV in quarters), the
    # program checks against the untouched model holding the checkpoint's weights, and saves its quarters
    lines: list[str] = []
    cmp = run_training(spec, Plan(tp=4), RunOptions(steps=2, resume=str(tmp_path / "a"), save=str(tmp_path / "b"),
                                                   check=True, **common), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("loss step 2" in line for line in lines)
    # what it saved is what the untouched model holds after the same two steps from the checkpoint
    b = exported_weights(tmp_path / "b")
    for _ in range(2):
        optimizer.zero_grad()
        reference_step(reference, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, 1)
        optimizer.step()
    assert set(b) == set(a)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(b[name], p.detach(), rtol=1e-5, atol=1e-5, msg=name)


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    done = runner.invoke(main, ["run", GPT, "--resume", str(tmp_path / "empty")])
    assert done.exit_code == 2 and "is not a graphsplit checkpoint" in done.output and done.output.count("\n") == 1
    done = runner.invoke(main, ["export-weights", str(tmp_path / "empty"), str(tmp_path / "w.safetensors")])
    assert done.exit_code == 2 and "is not a graphsplit checkpoint" in done.output
    assert not (tmp_path / "w.safetensors").exists()
    done = runner.invoke(main, ["run", GPT, "--steps", "0"])
    assert done.exit_code == 2 and "--steps must be at least 1" in done.output


def test_export_refuses_other_suffixes(tmp_path, one_process_group):
    dcp_state.save_checkpoint(tmp_path / "c", {"a": torch.ones(2)}, step=1, record={})
    with pytest.raises(GraphsplitError, match="should end in .safetensors"):
        dcp_state.export_weights(tmp_path / "c", tmp_path / "w.bin")
    assert Path(tmp_path / "w.bin").exists() is False


# --- checkpoints are read without running code from them (issue 9, item 5) ---


class _RunsCode:
    """Pickles as a call: unpickling it runs `func(arg)` (what a crafted `.metadata` does)."""

    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return self.func, (self.arg,)


def _crafted(kind: str, marker: Path) -> bytes:
    import builtins
    import pickle

    if kind == "os.system":
        return pickle.dumps(_RunsCode(os.system, f"touch {marker}"))
    assert kind == "builtins.exec"
    return pickle.dumps(_RunsCode(builtins.exec, f"open({str(marker)!r}, 'w').close()"))


def _small_checkpoint(folder: Path) -> Path:
    """A real checkpoint of a few tensors, written in this process (needs a process group)."""
    state = {"lin.weight": torch.randn(4, 3), "lin.bias": torch.randn(4)}
    dcp_state.save_checkpoint(folder, state, step=2, record={"plan": {}, "aliases": {}})
    return folder


@pytest.mark.parametrize("kind", ["os.system", "builtins.exec", "inside-metadata"])
def test_a_crafted_metadata_runs_nothing_and_is_one_line(tmp_path, one_process_group, kind):
    import pickle

    ckpt = _small_checkpoint(tmp_path / "runs" / "step-2")
    marker = tmp_path / "pwned"
    if kind == "inside-metadata":  # DCP's own metadata, one tensor's dtype replaced by the call
        metadata = safe_read.read_metadata(ckpt)
        metadata.state_dict_metadata["lin.bias"].properties.dtype = _RunsCode(os.system, f"touch {marker}")
        payload = pickle.dumps(metadata)
    else:
        payload = _crafted(kind, marker)
    (ckpt / ".metadata").write_bytes(payload)
    runner = CliRunner()
    out = tmp_path / "w.safetensors"
    for args in (["export-weights", str(ckpt), str(out)],
                 ["export-weights", str(ckpt.parent), str(out)],  # the --save folder: its newest checkpoint
                 ["run", str(EXAMPLES / "mlp.py"), "--pp", "2", "--resume", str(ckpt)],
                 ["run", str(EXAMPLES / "mlp.py"), "--pp", "2", "--resume", str(ckpt.parent)]):
        done = runner.invoke(main, args)
        assert not marker.exists(), f"{args[0]} ran code from the checkpoint"
        assert done.exit_code == 2, done.output
        assert done.output.count("\n") == 1 and done.output.startswith("error: "), done.output
        assert "refused, nothing from it was run" in done.output and str(ckpt / ".metadata") in done.output
        assert not out.exists()
    with pytest.raises(GraphsplitError, match="refused"):
        dcp_state.load_checkpoint(ckpt, {"lin.weight": torch.zeros(4, 3)}, same_world=True)  # the ranks' path
    assert not marker.exists()


def test_real_checkpoints_need_only_the_allowed_types(tmp_path, one_process_group):
    # every dtype and a channels-last tensor: the allow-list covers what DCP pickles for them
    state = {f"t.{dtype}".replace("torch.", ""): torch.ones(2, 3, dtype=dtype)
             for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool)}
    state["conv"] = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    ckpt = tmp_path / "c"
    dcp_state.save_checkpoint(ckpt, state, step=1, record={})
    metadata = safe_read.read_metadata(ckpt)
    assert {k: md.properties.dtype for k, md in metadata.state_dict_metadata.items() if k in state} == \
        {k: v.dtype for k, v in state.items()}
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    assert dcp_state.load_checkpoint(ckpt, loaded, same_world=True) == 1
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_byte_items_are_never_unpickled(tmp_path, one_process_group):
    import io

    # DCP stores a non-tensor as torch.save bytes, which its default planner loads with weights_only=False
    ckpt = tmp_path / "c"
    dcp_state.save_checkpoint(ckpt, {"a": torch.ones(2), "blob": io.BytesIO(b"not a tensor")}, step=1, record={})
    assert isinstance(safe_read.stored_keys(ckpt)["blob"], safe_read.BytesStorageMetadata)
    with pytest.raises(GraphsplitError, match="'blob' as pickled bytes"):
        dcp_state.load_checkpoint(ckpt, {"a": torch.zeros(2), "blob": torch.zeros(1)}, same_world=True)
    item = type("Item", (), {"dest_index": safe_read.MetadataIndex("blob")})()
    with pytest.raises(GraphsplitError, match="not a tensor"):
        blocks.LoadPlanner().load_bytes(item, io.BytesIO(b""))
    names = dcp_state.export_weights(ckpt, tmp_path / "w.safetensors")  # tensors only: the blob is never read
    assert names == ["a"]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "deleted shard": (lambda c: next(c.glob("*.distcp")).unlink(), "lacks its tensor file"),
    "truncated shard": (lambda c: _truncate(next(c.glob("*.distcp"))), "is truncated"),
    "truncated metadata": (lambda c: _truncate(c / ".metadata"), r"\.metadata is damaged"),
    "garbage metadata": (lambda c: (c / ".metadata").write_bytes(os.urandom(300)), r"\.metadata"),
    "empty metadata": (lambda c: (c / ".metadata").write_bytes(b""), r"\.metadata is damaged"),
    "metadata of another kind": (lambda c: (c / ".metadata").write_bytes(__import__("pickle").dumps([1, 2])),
                                 "it holds a list"),
    "corrupt graphsplit.json": (lambda c: (c / "graphsplit.json").write_text('{"step": 2,'), "graphsplit.json is unreadable"),
    "graphsplit.json a list": (lambda c: (c / "graphsplit.json").write_text("[1]"), "not graphsplit's record"),
    "graphsplit.json binary": (lambda c: (c / "graphsplit.json").write_bytes(b"\xff\xfe\x00"), "graphsplit.json is unreadable"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_export_of_a_damaged_checkpoint_is_one_line(tmp_path, one_process_group, damage):
    ckpt = _small_checkpoint(tmp_path / "runs" / "step-2")
    spoil, message = DAMAGE[damage]
    spoil(ckpt)
    out = tmp_path / "w.safetensors"
    done = CliRunner().invoke(main, ["export-weights", str(tmp_path / "runs"), str(out)])
    assert done.exit_code == 2 and done.output.count("\n") == 1 and done.output.startswith("error: "), done.output
    assert re.search(message, done.output), done.output
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["runs"], "no output, nor a temporary file"


# --- a series of checkpoints: --save DIR writes DIR/step-<N> (issue 9, item 7) ---


def _fake_checkpoint(folder: Path, with_info: bool = True, with_metadata: bool = True) -> None:
    folder.mkdir(parents=True)
    if with_info:
        (folder / "graphsplit.json").write_text('{"step": 0}')
    if with_metadata:
        (folder / ".metadata").write_bytes(b"")


def test_the_newest_complete_checkpoint_is_chosen(tmp_path):
    root = tmp_path / "run"
    _fake_checkpoint(root / "step-2")
    _fake_checkpoint(root / "step-10")  # newer than step-2 by number, older by name
    _fake_checkpoint(root / "step-12", with_info=False)  # a save that never finished
    _fake_checkpoint(root / "step-11", with_metadata=False)
    _fake_checkpoint(root / "step-x")  # not a step folder
    _fake_checkpoint(root / "latest")
    _fake_checkpoint(root / ".step-14.tmp-abc123")  # a killed save's temporary folder
    (root / "step-13").write_text("a file, not a folder")
    assert [step for step, _ in series.checkpoints_in(root)] == [2, 10]
    assert series.resolve_checkpoint(root) == root / "step-10"
    assert series.resolve_checkpoint(root / "step-2") == root / "step-2"  # a checkpoint folder is taken as it is
    with pytest.raises(GraphsplitError, match="is not a graphsplit checkpoint and holds none"):
        series.resolve_checkpoint(root / "step-12")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphsplitError, match="is not a graphsplit checkpoint"):
        series.resolve_checkpoint(tmp_path / "empty")


def test_save_series_keeps_the_newest_and_removes_stale_temporaries(tmp_path, one_process_group):
    root = tmp_path / "run"
    stale = [root / ".step-6.tmp-k2j4x9", root / ".step-2.old-0a1b2c3d"]  # a save killed mid-way, a swap killed
    for folder in stale:
        (folder / "x").mkdir(parents=True)
    (tmp_path / ".run.tmp-zz").mkdir()  # not ours to clean: a sibling of the --save folder
    weight = torch.randn(3)
    resumed_from = None
    for step in (2, 4, 6, 8):
        folder = dcp_state.save_series(root, {"w": weight + step}, step, {}, keep_last=2, keep=resumed_from)
        assert folder == root / f"step-{step}"
        if step == 2:
            assert not any(p.exists() for p in stale), "the next save removes what a killed one left"
            resumed_from = folder  # the checkpoint a run started from is never removed by that run
    assert sorted(p.name for p in root.iterdir()) == ["step-2", "step-6", "step-8"]
    assert (tmp_path / ".run.tmp-zz").exists()
    loaded = torch.zeros(3)
    assert dcp_state.load_checkpoint(series.resolve_checkpoint(root), {"w": loaded}, same_world=True) == 8  # the newest
    assert torch.equal(loaded, weight + 8)
    assert dcp_state.export_weights(root, tmp_path / "w.safetensors") == ["w"]
    assert torch.equal(load_file(tmp_path / "w.safetensors")["w"], weight + 8)


def test_save_refuses_a_folder_it_did_not_write(tmp_path, one_process_group):
    series.require_save_folder(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    series.require_save_folder(tmp_path / "empty")
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(GraphsplitError, match="graphsplit did not write .*notes.txt"):
        series.require_save_folder(user)
    with pytest.raises(GraphsplitError, match="graphsplit did not write"):
        dcp_state.save_series(user, {"w": torch.ones(1)}, 1, {}, keep_last=3)
    assert [p.name for p in user.iterdir()] == ["notes.txt"]
    single = _small_checkpoint(tmp_path / "single")
    with pytest.raises(GraphsplitError, match="is a single checkpoint"):
        series.require_save_folder(single)
    done = CliRunner().invoke(main, ["run", str(EXAMPLES / "mlp.py"), "--pp", "2", "--save", str(user)])
    assert done.exit_code == 2 and "graphsplit did not write" in done.output and done.output.count("\n") == 1
    done = CliRunner().invoke(main, ["run", str(EXAMPLES / "mlp.py"), "--pp", "2", "--save-every", "2"])
    assert done.exit_code == 2 and "--save-every needs --save" in done.output


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _crash(proc) -> None:
    """Kill the launcher, torchrun and every rank at once, as a machine failure would (torchrun starts
    each rank in a session of its own, so one process group does not hold them all)."""
    import signal

    tree = [proc.pid, *_descendants(proc.pid)]
    for pid in tree:  # freeze first, so nothing is written between the first kill and the last
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    tree += _descendants(proc.pid)
    run_dirs = set()  # the launcher's temporary folder, which a killed launcher cannot remove
    for pid in tree:
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            run_dirs.update(Path(a).parent for a in args if a.endswith("spec.json"))
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for folder in run_dirs:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the run's processes in /proc")
def test_a_killed_run_resumes_from_its_last_checkpoint_and_trains_on_as_the_untouched_model(tmp_path):
    """pp2 with AdamW, killed after its step-2 checkpoint: the resumed run names the checkpoint,
    its losses continue the untouched model's curve, and --check (the untouched model starting from
    the checkpoint's weights and AdamW state) passes. That a resume equals an uninterrupted run to
    the bit is tests/test_fp16.py's resume test (which also carries the loss scale)."""
    import subprocess
    import sys

    model = str(MODELS / "slow_loss.py")  # slow steps: the kill lands before the next checkpoint
    # 2 processes (the suite's budget): tp-sharded AdamW state across a resume is test_parallelize's
    common = ["--pp", "2", "--optimizer", "adamw", "--lr", "0.01", "--timeout", "240"]

    def graphsplit(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "graphsplit", "run", model, *common, *args], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    # what an uninterrupted run's 4 steps give: the untouched model trained in this process
    loaded = load_model(model)
    _, curve = reference_train(loaded.build("cpu", seed=0), loaded, Plan(pp=2), 4, "adamw", 0.01)

    def uninterrupted(steps):
        return {k: pytest.approx(curve[k - 1], rel=1e-4) for k in steps}

    ckpt = tmp_path / "ckpt"
    killed = graphsplit("--steps", "4", "--save", str(ckpt), "--save-every", "2")
    seen: list[str] = []
    try:
        for line in killed.stdout:
            seen.append(line)
            if line.startswith("saved step 2 "):
                break
    finally:
        _crash(killed)
    assert seen and seen[-1].startswith("saved step 2 "), "".join(seen) + killed.stderr.read()
    assert [step for step, _ in series.checkpoints_in(ckpt)] == [2], "the kill came after step 2's checkpoint only"
    before = _losses("".join(seen))
    assert {k: float(v) for k, v in before.items()} == uninterrupted(range(1, 3))

    resumed = graphsplit("--steps", "2", "--resume", str(ckpt), "--save", str(ckpt), "--save-every", "2",
                         "--keep-last", "1", "--check")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out + err
    assert f"resuming from {ckpt / 'step-2'} (step 2)" in out
    assert "check passed" in out, out
    after = _losses(out)
    assert {k: float(v) for k, v in after.items()} == uninterrupted(range(3, 5)), "the resumed steps are not steps 3-4"
    # --keep-last 1 removes no checkpoint a run resumed from: step-2 stays, beside the newest
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-4"]
    assert record.read_info(ckpt / "step-4")["step"] == 4
