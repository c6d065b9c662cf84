"""Checkpoints: DCP with the original names, resharded on load, exported for the untouched model,
resumed with exactly the losses of an uninterrupted run, and never half-written."""

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner
from safetensors.torch import load_file

from graphsplit import GraphsplitError, Plan, dcp
from graphsplit.check import reference_step
from graphsplit.cli import main
from graphsplit.launch import RunOptions, run_training
from graphsplit.loader import load_model
from graphsplit.sharding import R, S, shard_tensor
from graphsplit.worker import make_optimizer

from .conftest import EXAMPLES

GPT = str(EXAMPLES / "gpt.py")


@pytest.mark.parametrize("sharding", [R, S(0), S(1), S(0, (6, 6, 6)), S(0, (8, 4, 4))])
@pytest.mark.parametrize("tp", [1, 2])
def test_every_rank_blocks_cover_the_whole_tensor_once(sharding, tp):
    full = torch.arange(18 * 4, dtype=torch.float32).reshape(18, 4) if sharding.dim != 1 else torch.randn(6, 8)
    if sharding.chunks:
        full = torch.randn(sum(sharding.chunks), 3)
    rebuilt = torch.full_like(full, float("nan"))
    seen: dict[tuple, torch.Tensor] = {}
    for rank in range(tp):
        local = shard_tensor(full, sharding, rank, tp).clone()
        pieces = dcp.pieces_of(local, sharding, rank, tp)
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


@pytest.fixture
def one_process_group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.HashStore()
    dist.init_process_group("gloo", rank=0, world_size=1, store=store, timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_a_crash_during_save_leaves_the_previous_checkpoint_whole(tmp_path, one_process_group, monkeypatch):
    weight = torch.randn(4, 3)
    state = {"lin.weight": dcp.pieces_of(weight, R, 0, 1)}
    target = tmp_path / "ckpt"
    dcp.save_checkpoint(target, state, step=3, record={"plan": {}})
    assert dcp.read_info(target)["step"] == 3

    real_save = dcp.dcp.save

    def crash_after_writing(*args, **kwargs):
        real_save(*args, **kwargs)  # the tensor files and .metadata are on disk...
        raise RuntimeError("killed")  # ...and the process dies before the record

    monkeypatch.setattr(dcp.dcp, "save", crash_after_writing)
    with pytest.raises(RuntimeError, match="killed"):
        dcp.save_checkpoint(target, {"lin.weight": dcp.pieces_of(weight + 1, R, 0, 1)}, step=4, record={"plan": {}})
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"], "no temporary folder is left behind"
    loaded = torch.zeros(4, 3)
    assert dcp.load_checkpoint(target, {"lin.weight": dcp.pieces_of(loaded, R, 0, 1)}, same_world=True) == 3
    assert torch.equal(loaded, weight)

    monkeypatch.setattr(dcp.dcp, "save", real_save)
    half = tmp_path / "half"
    half.mkdir()
    (half / ".metadata").write_bytes(b"")
    with pytest.raises(GraphsplitError, match="not a graphsplit checkpoint"):
        dcp.read_info(half)  # tensor files without the record are not a checkpoint


def test_loading_checks_names_and_shapes(tmp_path, one_process_group):
    dcp.save_checkpoint(tmp_path / "c", {"a": torch.ones(2, 2)}, step=1, record={})
    with pytest.raises(GraphsplitError, match="has no tensor 'b'"):
        dcp.load_checkpoint(tmp_path / "c", {"b": torch.ones(2, 2)}, same_world=True)
    with pytest.raises(GraphsplitError, match=r"shape \(2, 2\), the model has \(3, 2\)"):
        dcp.load_checkpoint(tmp_path / "c", {"a": torch.ones(3, 2)}, same_world=True)
    with pytest.raises(GraphsplitError, match="no optimizer state"):
        dcp.load_checkpoint(tmp_path / "c", {"a": torch.ones(2, 2), "optimizer/a/exp_avg": torch.ones(2, 2)}, True)


def _losses(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"step\s+(\d+)\s+loss (\S+)", text)}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_resumed_run_continues_exactly_as_an_uninterrupted_one(tmp_path, capfd):
    plan = Plan(tp=2, pp=2)
    common = dict(optimizer="adamw", lr=0.01, timeout_s=240)
    run_training(GPT, plan, RunOptions(steps=4, save=str(tmp_path / "whole"), **common), echo=print)
    whole = _losses(capfd.readouterr().out)
    run_training(GPT, plan, RunOptions(steps=2, save=str(tmp_path / "half"), **common), echo=print)
    # --check on the resumed run: the untouched model starts from the checkpoint's weights and AdamW state
    lines: list[str] = []
    cmp = run_training(GPT, plan, RunOptions(steps=2, resume=str(tmp_path / "half"), save=str(tmp_path / "resumed"),
                                             check=True, **common), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("loss step 3" in line for line in lines)
    halves = _losses(capfd.readouterr().out)
    assert sorted(whole) == [1, 2, 3, 4] and halves == whole
    a = dcp.export_weights(tmp_path / "whole", tmp_path / "whole.safetensors")
    b = dcp.export_weights(tmp_path / "resumed", tmp_path / "resumed.safetensors")
    assert a == b
    x, y = load_file(tmp_path / "whole.safetensors"), load_file(tmp_path / "resumed.safetensors")
    assert all(torch.equal(x[k], y[k]) for k in x), "parameters after 4 steps differ from stop-and-resume"
    assert dcp.read_info(tmp_path / "resumed")["step"] == 4


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_checkpoint_reshards_to_another_plan_and_loads_into_the_untouched_model(tmp_path):
    # SGD: one AdamW step turns gradients of 1e-10 into updates of lr, so values after it are not comparable
    common = dict(optimizer="sgd", lr=0.01, timeout_s=300)
    run_training(GPT, Plan(tp=4, pp=2), RunOptions(steps=1, save=str(tmp_path / "a"), **common), echo=print)
    # step 0 at another plan: load tp4 x pp2 blocks into tp2 x pp1 ranks, save again
    run_training(GPT, Plan(tp=2), RunOptions(steps=0, resume=str(tmp_path / "a"), save=str(tmp_path / "b"), **common),
                 echo=print)
    runner = CliRunner()
    for name in ("a", "b"):
        done = runner.invoke(main, ["export-weights", str(tmp_path / name), str(tmp_path / f"{name}.safetensors")])
        assert done.exit_code == 0, done.output
    a, b = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), "resharding changed a value"

    loaded = load_model(GPT)
    model = loaded.build("cpu", seed=0)
    assert set(a) == set(model.state_dict())  # the original names, tied aliases included
    reference = loaded.build("cpu", seed=0)
    optimizer = make_optimizer("sgd", list(reference.parameters()), 0.01)
    reference_step(reference, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, 2)  # the run's 2 micro-batches
    optimizer.step()
    model.load_state_dict(a, strict=True)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), p, rtol=1e-5, atol=1e-5, msg=name)

    # the resumed program at a third plan checks against the untouched model holding the checkpoint's weights
    lines: list[str] = []
    cmp = run_training(GPT, Plan(tp=2, pp=2), RunOptions(steps=2, resume=str(tmp_path / "b"), check=True, **common),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("loss step 2" in line for line in lines)


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
    dcp.save_checkpoint(tmp_path / "c", {"a": torch.ones(2)}, step=1, record={})
    with pytest.raises(GraphsplitError, match="should end in .safetensors"):
        dcp.export_weights(tmp_path / "c", tmp_path / "w.bin")
    assert Path(tmp_path / "w.bin").exists() is False
