"""Grad-mode regions survive the transform: the program trains exactly the parameters the
untouched model trains (no_grad, enable_grad inside no_grad, inference_mode, a @no_grad
forward, set_grad_enabled, .detach(), in-place ops under no_grad, frozen parameters), with
equal gradients, under torch.fx and torch.export; and the parity check fails when the sets
of parameters with a gradient differ."""


import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from graphsplit import GraphsplitError, Plan
from graphsplit.backends.local import LocalPipeline
from graphsplit.ir.meta import info
from graphsplit.launch.parity import check_locally, compare, missing_grads
from graphsplit.launch.reference import StepResult, precise_step, reference_step, reordered_step
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_program
from graphsplit.runtime.materialize import materialize_stage, model_tensors
from graphsplit.runtime.training import default_loss, make_loss

from .conftest import MODELS

W = 8
GRAD_MODES = MODELS / "grad_modes.py"


class Case(nn.Module):
    """Four linears (so pp 2 has places to cut); `region` decides what runs without grad."""

    def __init__(self, region):
        super().__init__()
        self.region = region
        self.first, self.second, self.third, self.last = (nn.Linear(W, W) for _ in range(4))

    def forward(self, x):
        return self.last(F.gelu(self.region(self, x)))


def no_grad(m, x):
    with torch.no_grad():
        h = m.first(x)
    return m.third(m.second(h).relu())


def enable_grad_inside_no_grad(m, x):
    with torch.no_grad():
        h = m.first(x)
        with torch.enable_grad():
            g = m.second(h)  # trained: grad on again, from an input that needs none
        h = h * 2
    return m.third(h) + g


def inference_mode(m, x):
    with torch.inference_mode():
        h = m.first(x).relu()
    return m.third(m.second(h.clone()))  # inference tensors are cloned before autograd may save them


def set_grad_enabled(m, x):
    with torch.set_grad_enabled(False):
        h = m.first(x)
    return m.third(m.second(h))


def detach(m, x):
    h = m.first(x)
    return m.third(m.second(h).detach() + h)


def requires_grad_on_activation(m, x):
    h = m.first(x).detach().requires_grad_()  # a new leaf: first trains nothing
    return m.third(m.second(h))


def in_place_under_no_grad(m, x):
    h = m.first(x)
    with torch.no_grad():  # invisible to autograd: h keeps needing its gradient
        h.clamp_(-0.5, 0.5)
        h += 1.0
        h.mul_(m.third.bias.mean())
    return m.third(m.second(h))


class DecoratedSecond(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(W, W)

    @torch.no_grad()
    def forward(self, x):
        return torch.tanh(self.inner(x))


def decorated(m, x):
    return m.third(m.second(m.first(x)) + m.decorated(x))


def frozen(m, x):
    return m.third(m.second(m.first(x)))


def build(region):
    torch.manual_seed(0)
    model = Case(region)
    if region is decorated:
        model.decorated = DecoratedSecond()
    if region is frozen:
        model.second.weight.requires_grad_(False)  # in the constructor, as a user freezes a layer
    return model


class ExportTraced(nn.Module):
    """`*inputs` makes torch.fx refuse the model, so torch.export traces it."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *inputs):
        return self.inner(*inputs)


def params(*modules):
    return {f"{m}.{p}" for m in modules for p in ("weight", "bias")}


# what the untouched model trains, written out: the reference itself is checked too
TRAINED = {
    no_grad: params("second", "third", "last"),
    enable_grad_inside_no_grad: params("second", "third", "last"),
    inference_mode: params("second", "third", "last"),
    set_grad_enabled: params("second", "third", "last"),
    detach: params("first", "third", "last"),
    requires_grad_on_activation: params("second", "third", "last"),
    in_place_under_no_grad: params("first", "second", "third", "last"),
    decorated: params("first", "second", "third", "last"),
    frozen: params("first", "third", "last") | {"second.bias"},
}


def run_locally(model, x, plan, program=None):
    """Step 1 of the program (every stage in this process) and of the untouched model."""
    program = program or rewrite_program(model, (x,), {}, plan).program
    stages = [materialize_stage(s, "cpu", model_tensors(model)) for s in program.stages]
    loss, out = LocalPipeline(program, stages, make_loss(program, None)).step((x,), torch.zeros(x.shape[0]))
    grads = {}
    for st, module in zip(program.stages, stages):
        for local, canonical in st.param_sources.items():
            if module.get_parameter(local).grad is not None:
                grads[canonical] = module.get_parameter(local).grad
    # the untouched model on the whole batch (no BatchNorm: nothing depends on the cut), and its spread
    step = ((x,), {}, torch.zeros(x.shape[0]), default_loss)
    ref = reference_step(model, *step)
    cmp = compare(loss, program.unflatten_output(out), grads, ref, precise=precise_step(model, *step),
                  reordered=reordered_step(model, *step))
    missing = missing_grads(ref, set(grads))
    cmp.failures.extend(f"grad {name}: no stage produced it" for name in missing)
    return program, grads, ref, cmp


@pytest.mark.parametrize("tracer", ["fx", "export"])
@pytest.mark.parametrize("region", list(TRAINED), ids=lambda f: f.__name__)
def test_program_trains_what_the_untouched_model_trains(region, tracer):
    model = build(region)
    if tracer == "export":
        model = ExportTraced(model)
    x = torch.randn(4, W, generator=torch.Generator().manual_seed(1))
    program, grads, ref, cmp = run_locally(model, x, Plan(pp=2))
    assert program.traced.tracer == tracer
    assert {n.removeprefix("inner.") for n in ref.grads} == TRAINED[region]  # the reference does what torch does
    assert set(grads) == set(ref.grads)
    assert cmp.ok, cmp.failures  # values too: fp32, 1e-5 relative (or the reference's own noise x10)


@pytest.mark.parametrize("spec", [str(GRAD_MODES), f"{GRAD_MODES}:build_export"], ids=["fx", "export"])
@pytest.mark.parametrize("plan", [Plan(pp=2), Plan(pp=4)], ids=["pp2", "pp4"])
def test_every_region_kind_in_one_model_split_into_stages(spec, plan):
    program, cmp = check_locally(load_model(spec), plan)
    assert cmp.ok, cmp.failures
    frozen = {"encoder", "teacher", "decorated", "stop", "norm.weight"}
    trained = {k.removeprefix("grad ").removesuffix(" (rank 0)") for k in cmp.max_diff if k.startswith("grad ")}
    assert trained and not any(t.startswith(f) for t in trained for f in frozen)
    assert {"adapter.weight", "body.1.weight", "norm.bias", "head.weight"} <= trained


class ClampedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(W, W)

    def forward(self, h):
        with torch.no_grad():
            h.clamp_(-0.5, 0.5)  # on the block's input: a stage's received activation after the cut
        return F.gelu(self.lin(h)) + h


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_in_place_under_no_grad_on_a_stage_input(tracer):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(W, W), *(ClampedBlock() for _ in range(3)))
    model = ExportTraced(model) if tracer == "export" else model
    cut = "inner.2" if tracer == "export" else "2"
    x = torch.randn(4, W, generator=torch.Generator().manual_seed(1))
    program, grads, ref, cmp = run_locally(model, x, Plan(pp=2, split_at=(cut,)))
    assert program.traced.tracer == tracer and len(ref.grads) == 8
    assert cmp.ok, cmp.failures


def test_a_stage_holds_only_what_it_reads_and_marks_what_never_trains():
    program, cmp = check_locally(load_model(str(GRAD_MODES)), Plan(pp=4))
    assert cmp.ok, cmp.failures
    # a frozen parameter's detach recomputed by the stage that reads it is not also kept by the one before
    holders = {name: stages for name, stages in program.param_stages.items()}
    assert all(len(stages) == 1 for stages in holders.values()), holders
    assert {"encoder.0.weight", "teacher.weight", "stop.weight", "norm.weight"} <= program.params_without_grad
    stage = materialize_stage(program.stages[0], "cpu", model_tensors(load_model(str(GRAD_MODES)).build("cpu")))
    assert not stage.get_parameter("encoder.0.weight").requires_grad  # DDP must not wait for it


def test_tensor_parallel_ranks_get_gradients_for_exactly_the_trained_parameters():
    """tp 2 in the local backend (a thread per rank, real collectives): each rank has a gradient for
    exactly the parameters it holds that the untouched model trains, equal to their slices."""
    program, cmp = check_locally(load_model(str(GRAD_MODES)), Plan(tp=2))
    assert program.param_shardings, "the trained body is still sharded"
    assert cmp.ok, cmp.failures
    for rank in (0, 1):
        trained = {k.removeprefix("grad ").removesuffix(f" (rank {rank})") for k in cmp.max_diff
                   if k.startswith("grad ") and k.endswith(f"(rank {rank})")}
        assert trained & set(program.param_shardings) and not trained & program.params_without_grad


def test_tracers_mark_each_op_with_its_grad_mode():
    from graphsplit.ir.trace import trace_model

    for model in (build(enable_grad_inside_no_grad), ExportTraced(build(enable_grad_inside_no_grad))):
        traced = trace_model(model, (torch.randn(2, W),), {})
        calls = [n for n in traced.gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        modes = [info(n).grad_enabled for n in calls]
        assert False in modes and True in modes, traced.tracer
        assert not any("wrap_with_set_grad_enabled" in str(n.target) for n in calls)  # export's regions inlined
        assert [mode_of_layer(traced.gm, name) for name in ("first", "second", "third")] == [False, True, True]


def mode_of_layer(gm, name):
    """The grad mode of the op that applies layer `name` (a call_module, or a linear of its weight)."""
    for node in gm.graph.nodes:
        reads = [a.target for a in node.all_input_nodes if a.op == "get_attr"]
        if (node.op == "call_module" and node.target.endswith(name)) or any(str(r).endswith(f"{name}.weight") for r in reads):
            return info(node).grad_enabled
    raise AssertionError(name)


def test_a_program_compiled_under_no_grad_still_trains_what_the_model_trains():
    # tracing starts in training's grad mode, whatever mode the caller of parallelize() is in
    x = torch.randn(4, W, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        program = rewrite_program(build(no_grad), (x,), {}, Plan(pp=2)).program
    _, grads, ref, cmp = run_locally(build(no_grad), x, Plan(pp=2), program)
    assert set(grads) == set(ref.grads) == TRAINED[no_grad]
    assert cmp.ok, cmp.failures


class WholeContainer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(W, 2 * W)

    def forward(self, x):
        parts = self.lin(x).split(W, dim=-1)
        with torch.no_grad():
            return torch.cat(parts)


def test_what_cannot_be_kept_is_refused_with_the_line():
    with pytest.raises(GraphsplitError, match=r"no_grad.*test_grad_mode.py:\d+"):
        rewrite_program(WholeContainer(), (torch.randn(2, W),), {}, Plan(pp=1))


def _ref(grads):
    return StepResult(torch.tensor(0.0), None, grads, [[n] for n in ("a", "b")])


def test_the_check_fails_on_a_gradient_the_original_model_does_not_have():
    cmp = compare(None, None, {"a": torch.ones(2), "b": torch.ones(2)}, _ref({"a": torch.ones(2)}))
    assert not cmp.ok
    assert any("b" in f and "no gradient" in f for f in cmp.failures)


def test_the_check_fails_on_a_rank_missing_a_gradient_the_original_model_has():
    ref = _ref({"a": torch.ones(2), "b": torch.ones(2)})
    assert compare(None, None, {"a": torch.ones(2)}, ref).ok  # another rank may hold b ...
    cmp = compare(None, None, {"a": torch.ones(2)}, ref, held={"a", "b"})  # ... but this one holds it
    assert not cmp.ok and any("b" in f for f in cmp.failures)
