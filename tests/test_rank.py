"""The one assembly of a rank's program (backends/rank.py), in this process on a world of one:
what `run`'s worker and `parallelize()` both get, trained, checked and checkpointed."""

import socket

import pytest
import torch
import torch.distributed as dist

from graphsplit import Plan
from graphsplit.backends import parallelize
from graphsplit.backends.rank import assemble_rank
from graphsplit.compile import compile_loaded
from graphsplit.launch.parity import RankStep, check_ranks
from graphsplit.launch.reference import reference_step
from graphsplit.loader import load_model
from graphsplit.runtime.dcp.record import model_names
from graphsplit.runtime.dcp.safe_read import stored_keys
from graphsplit.runtime.materialize import model_tensors
from graphsplit.runtime.training import make_optimizer

from .conftest import EXAMPLES


@pytest.fixture
def world_of_one(monkeypatch):
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_an_assembled_rank_trains_like_the_untouched_model_and_round_trips_its_checkpoint(tmp_path, world_of_one,
                                                                                       monkeypatch):
    steps: list[str] = []
    for name in ("apply_tp", "apply_sync_bn", "tied_groups", "build_schedule"):  # the steps run, in order
        real = getattr(parallelize, name)
        monkeypatch.setattr(parallelize, name, lambda *a, _real=real, _name=name, **k: steps.append(_name) or _real(*a, **k))
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    program = compile_loaded(loaded, Plan()).program
    model = loaded.build("cpu", seed=0)
    rank = assemble_rank(program, lambda stages: model_tensors(model), loaded.loss_fn, model_names(model))
    assert steps == ["apply_tp", "apply_sync_bn", "tied_groups", "build_schedule"]
    assert (rank.dp_rank, rank.pp_rank, rank.tp_rank) == (0, 0, 0) and list(rank.modules) == [0]

    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    loss, output = rank.pipeline.step(inputs, loaded.target)
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, program.plan.num_microbatches)
    cmp = check_ranks(program, [RankStep(0, (0,), rank.pipeline.grads(), loss, output)], ref)
    assert cmp.ok, cmp.failures

    optimizer = make_optimizer("adamw", rank.pipeline.parameters(), 1e-3)
    assert rank.pipeline.optimizer_step(optimizer)
    rank.save_checkpoint(tmp_path / "c", optimizer, 1, rank.record("gpt.py", optimizer))
    persistent, aliases = model_names(model)
    stored = stored_keys(tmp_path / "c")
    assert persistent - set(aliases) <= set(stored)  # the original names, each tied tensor once
    assert "optimizer/h.0.attn.c_attn.weight/exp_avg" in stored

    # another assembly (other initial values) takes the checkpoint's values and optimizer state
    other = loaded.build("cpu", seed=1)
    again = assemble_rank(program, lambda stages: model_tensors(other), loaded.loss_fn, model_names(other))
    optimizer2 = make_optimizer("adamw", again.pipeline.parameters(), 1e-3)
    assert again.load_checkpoint(tmp_path / "c", optimizer2) == 1
    for (name, a), b in zip(rank.modules[0].named_parameters(), again.modules[0].parameters()):
        assert torch.equal(a, b), name
    assert torch.equal(optimizer2.state[next(iter(again.modules[0].parameters()))]["exp_avg"],
                       optimizer.state[next(iter(rank.modules[0].parameters()))]["exp_avg"])
