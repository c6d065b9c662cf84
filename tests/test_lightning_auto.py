"""`GraphsplitStrategy(plan="auto")`'s planning, without processes: the search where each dp replica trains
on the DataLoader's batch, an in-memory module read on meta, and the one-line refusals. The Trainer
training under the plan it finds is tests/test_lightning.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

sys.path.insert(0, str(Path(__file__).parent / "models"))

from lightning_gpt import LightningGPT, dataset  # noqa: E402

from graphsplit.errors import GraphsplitError  # noqa: E402
from graphsplit.lightning.auto_plan import auto_plan  # noqa: E402
from graphsplit.lightning.steps import step_module  # noqa: E402
from graphsplit.loader import meta_twin, model_in_memory  # noqa: E402
from graphsplit.planner import load_hardware, plan_model  # noqa: E402
from graphsplit.planner.price import price_plan  # noqa: E402

BATCH = 4


@pytest.fixture(scope="module")
def module_and_batch():
    torch.manual_seed(0)
    module = LightningGPT()
    batch = next(iter(torch.utils.data.DataLoader(dataset(16), batch_size=BATCH)))
    return module, batch


def test_meta_twin_copies_no_weight_and_keeps_ties(module_and_batch):
    module, _ = module_and_batch
    twin = meta_twin(module)
    assert all(p.device.type == "meta" for p in twin.parameters())
    assert all(p.device.type == "cpu" for p in module.parameters())  # the module itself untouched
    assert twin.model.wte.weight is twin.model.lm_head.weight  # tied in the model, tied in the twin
    kept = meta_twin(module, buffers=False)
    assert all(b.device.type == "cpu" for b in kept.buffers())


def test_replica_batch_search_prices_each_plan_at_its_global_batch(module_and_batch):
    """Each replica trains on the batch given: a plan with dp r is priced as the plain search prices it for
    r times that batch, and the plans are ranked by samples per second."""
    module, batch = module_and_batch
    traced, _ = step_module(module, "training_step", batch)
    hw = load_hardware("cpu")
    memory = 2**30
    result, profile = plan_model(model_in_memory(traced, tuple(batch)), 4, memory, hw, 4, replica_batch=True,
                                 keep=lambda p: not p.compile and p.checkpoint == "none")
    assert result.fits
    rates = [e.samples_per_second for e in result.plans]
    assert rates == sorted(rates, reverse=True)
    assert {e.plan.dp for e in result.plans} == {1, 2, 4}
    assert all(not e.plan.compile and e.plan.checkpoint == "none" and e.plan.cp == 1 for e in result.plans)
    for dp in (1, 2, 4):
        est = next(e for e in result.plans if e.plan.dp == dp)
        again = price_plan(profile.for_batch(BATCH * dp), est.plan, hw, memory, 4, compare=False).estimate
        assert again.step_seconds == pytest.approx(est.step_seconds, rel=1e-9)
        assert again.samples_per_second == pytest.approx(BATCH * dp / est.step_seconds, rel=1e-6)


def test_auto_plan_keeps_the_fields_given(module_and_batch):
    module, batch = module_and_batch
    plan, line = auto_plan(module, batch, 4, 4, load_hardware("cpu"), 2**30, {"pp": 2, "compile": False})
    assert plan.pp == 2 and not plan.compile and plan.world_size == 4
    assert line.startswith("graphsplit: plan='auto' chose") and "samples/s" in line


def test_auto_plan_says_when_nothing_fits(module_and_batch):
    module, batch = module_and_batch
    with pytest.raises(GraphsplitError, match=r"no plan keeping pp=2 fits 2 devices of 1.0 MiB: the leanest needs"):
        auto_plan(module, batch, 2, 2, load_hardware("cpu"), 2**20, {"pp": 2})


def test_strategy_refusals():
    from graphsplit.lightning import GraphsplitFabricStrategy, GraphsplitStrategy

    with pytest.raises(GraphsplitError, match="Plan has no field pipeline"):
        GraphsplitStrategy(plan="auto", pipeline=2)
    with pytest.raises(GraphsplitError, match="hardware= and gpu_memory= are what plan='auto' plans for"):
        GraphsplitStrategy(pp=2, hardware="h100")
    with pytest.raises(GraphsplitError, match="GraphsplitFabricStrategy\\(plan='auto'\\) is not built"):
        GraphsplitFabricStrategy(plan="auto")
    GraphsplitStrategy(plan="auto", pp=2, hardware="h100", gpu_memory="80GiB")  # taken


def test_a_planner_failure_that_is_no_graphsplit_error_reaches_every_rank_as_one_line(monkeypatch, module_and_batch):
    """A bug in the planner under plan='auto': rank 0 raises the line it broadcast to the others (a
    GraphsplitError naming the exception), not the planner's traceback."""
    from graphsplit.lightning import GraphsplitStrategy
    from graphsplit.lightning import auto_plan as auto_module

    module, batch = module_and_batch
    strategy = GraphsplitStrategy(plan="auto", hardware="cpu", gpu_memory="1GiB")
    strategy.parallel_devices = [torch.device("cpu")]
    strategy._lightning_module = module
    sent = []
    monkeypatch.setattr(strategy, "broadcast", lambda obj, src=0: sent.append(obj) or obj)
    monkeypatch.setattr(auto_module, "first_batch", lambda trainer: batch)

    def broken(*args, **kwargs):
        raise KeyError("aten.some_op")

    monkeypatch.setattr(auto_module, "auto_plan", broken)
    with pytest.raises(GraphsplitError, match=r"^plan='auto' failed on rank 0: KeyError: 'aten.some_op'$") as caught:
        strategy._choose_plan(trainer=None)
    assert sent == [str(caught.value)] and isinstance(caught.value.__cause__, KeyError)
