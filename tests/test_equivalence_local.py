"""Every example, split and run stage by stage in one process, equals the untouched model:
loss, output and every parameter's gradient (fp32, 1e-5 relative, or the untouched model's own noise x10)."""

from pathlib import Path

import pytest
import torch

from graphsplit import Plan
from graphsplit.launch.parity import check_locally
from graphsplit.loader import LoadedModel, load_model

from .conftest import EXAMPLES, MODELS

MODELS_UNDER_TEST = [EXAMPLES / f for f in ("gpt.py", "unet.py", "resnet.py", "mlp.py")] + [MODELS / "last_input.py"]
PLANS = {
    "pp2": Plan(pp=2),
    "pp4": Plan(pp=4),
    "pp2x2-interleaved": Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2),
}
MORE = [("llama.py", Plan(pp=2, checkpoint="selective")), ("llama.py", Plan(pp=2)), ("bert.py", Plan(pp=2))]


@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("path", MODELS_UNDER_TEST, ids=lambda p: p.stem)
def test_local_pipeline_matches_untouched_model(path, plan_name):
    program, cmp = check_locally(load_model(str(path)), PLANS[plan_name])
    assert len(program.stages) == PLANS[plan_name].num_stages
    assert cmp.ok, cmp.failures
    assert any(k.startswith("grad") for k in cmp.max_diff)


@pytest.mark.parametrize("name, plan", MORE, ids=[f"{n.removesuffix('.py')}-pp{p.pp}-{p.checkpoint}" for n, p in MORE])
def test_more_models_and_checkpoint_policies(name, plan):
    _, cmp = check_locally(load_model(str(EXAMPLES / name)), plan)
    assert cmp.ok, cmp.failures


def test_the_check_catches_an_unsummed_tied_gradient(monkeypatch):
    # Sabotage: skip summing the tied embedding/LM-head gradient across stages.
    import graphsplit.backends.local as local

    monkeypatch.setattr(local, "sync_tied_grads", lambda *a, **k: None)
    _, cmp = check_locally(load_model(str(EXAMPLES / "gpt.py")), Plan(pp=2))
    assert not cmp.ok
    assert any("wte.weight" in f or "lm_head.weight" in f for f in cmp.failures)


def test_a_program_planned_at_one_batch_size_runs_at_another():
    import torch

    from graphsplit.backends.local import LocalPipeline
    from graphsplit.rewrite import rewrite_loaded
    from graphsplit.runtime.materialize import materialize_stage, model_tensors
    from graphsplit.runtime.training import default_loss

    for name in ("gpt.py", "unet.py"):  # one export-traced, one fx-traced
        loaded = load_model(str(EXAMPLES / name))
        program = rewrite_loaded(loaded, Plan(pp=2)).program
        model = loaded.build("cpu", seed=0)
        stages = [materialize_stage(s, "cpu", model_tensors(model)) for s in program.stages]
        (x,) = loaded.args
        bigger = torch.cat([x, x.flip(0), x], dim=0)  # 3x the planned batch
        out = LocalPipeline(program, stages, default_loss).forward_stages((bigger,))
        torch.testing.assert_close(program.unflatten_output(out), model(bigger), rtol=1e-5, atol=1e-5)


class _Constants(torch.nn.Module):
    """forward(**kwargs) sends the trace to torch.export, which lifts the tensors forward makes
    (`torch.tensor(...)`) into constants of the graph: no parameter or buffer of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, **batch):
        h = self.a(batch["x"]) * torch.tensor([3.0])
        return self.b(torch.relu(h)) + torch.tensor([0.5, -0.5]).repeat(4)


def test_tensor_constants_the_model_makes_in_forward_keep_their_values_in_every_stage():
    loaded = LoadedModel(Path("constants.py"), "build", _Constants, (), {"x": torch.randn(4, 8)}, None, None)
    program, cmp = check_locally(loaded, Plan(pp=2))
    assert cmp.ok, cmp.failures
    constants = {k: v for st in program.stages for k, v in st.constants.items()}
    assert sorted(v.tolist() for v in constants.values()) == [[0.5, -0.5], [3.0]]
