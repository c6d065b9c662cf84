"""Fast init: each rank draws only the blocks it holds, and element i of a parameter has one value
at every plan (tp 1, tp 2, pp 2, tp 2 x pp 2 reassemble to the same model), drawn from the
distribution the module's own init uses. `--check` keeps the exact mode."""

import math

import pytest
import torch

from graphsplit import GraphsplitError, Plan
from graphsplit.ir.sharding import shard_tensor
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.fast_init import FastInit, fast_model, model_rules
from graphsplit.runtime.init_mode import FAST_INIT_ABOVE, choose_init
from graphsplit.runtime.materialize import materialize_stages

from .conftest import EXAMPLES, MODELS


def _blocks(loaded, plan, seed=3):
    """Every (tp rank, stage) module fast init materializes at `plan`, and the elements drawn per tp rank."""
    program = rewrite_loaded(loaded, plan).program
    out, drawn = {}, []
    for rank in range(plan.tp):
        source = FastInit.for_model(loaded, seed)
        for s, module in materialize_stages(program, range(len(program.stages)), "cpu", source, rank).items():
            out[rank, s] = module
        drawn.append(source.drawn)
    return program, out, drawn


def test_every_plan_holds_slices_of_one_model():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    whole = dict(fast_model(loaded, 3).named_parameters())
    seen = set()
    for plan in (Plan(pp=2), Plan(tp=2, pp=2)):  # the whole model is tp 1, pp 1
        program, modules, _ = _blocks(loaded, plan)
        for (rank, s), module in modules.items():
            for local, canonical in program.stages[s].param_sources.items():
                want = shard_tensor(whole[canonical].detach(), program.param_sharding(canonical), rank, plan.tp)
                assert torch.equal(module.get_parameter(local), want), (plan, rank, canonical)
                seen.add((canonical, plan.tp > 1 and program.param_sharding(canonical) is not None))
    assert {n for n, _ in seen} == set(whole)
    assert any(sharded for _, sharded in seen)  # tp shards (column, row, fused QKV, vocab) among them


def test_a_rank_draws_what_it_holds():
    loaded = load_model(str(MODELS / "wide_mlp.py"))
    total = sum(p.numel() for p in loaded.build("meta").parameters())
    _, _, whole = _blocks(loaded, Plan())
    _, modules, drawn = _blocks(loaded, Plan(tp=2))
    assert whole == [total]
    for rank in range(2):
        held = sum(p.numel() for (r, _), m in modules.items() if r == rank for p in m.parameters())
        # column-parallel up (weight and bias) and row-parallel down's weight: half each; down's bias whole
        assert held == total // 2 + 512
        assert drawn[rank] == held


def test_values_follow_the_modules_own_init():
    loaded = load_model(str(MODELS / "wide_mlp.py"))
    model = fast_model(loaded, 0)
    w = model.up.weight.detach()
    bound = 1 / math.sqrt(1024)  # kaiming_uniform(a=sqrt(5)) on a fan-in of 1024
    assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
    assert abs(float(w.mean())) < 0.01 * bound
    assert abs(float(w.std()) - bound / math.sqrt(3)) < 0.01 * bound  # the std of U(-b, b)
    gpt = fast_model(load_model(str(EXAMPLES / "gpt.py")), 0)
    emb = gpt.get_parameter(next(n for n, m in gpt.named_modules() if isinstance(m, torch.nn.Embedding)) + ".weight").detach()
    assert abs(float(emb.std()) - 1.0) < 0.05 and abs(float(emb.mean())) < 0.05  # nn.Embedding: N(0, 1)
    norms = [m for m in gpt.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(bool((m.weight == 1).all()) and bool((m.bias == 0).all()) for m in norms)
    assert not torch.equal(fast_model(loaded, 1).up.weight, w), "the seed changes the values"


def test_auto_is_exact_with_check_and_below_the_threshold_and_fast_above():
    small = load_model(str(EXAMPLES / "gpt.py")).build("meta")
    assert choose_init("auto", small, check=False)[0] == "exact"
    big = torch.nn.Linear(1, 1, device="meta")  # as many parameters as the threshold, on meta
    big.weight = torch.nn.Parameter(torch.empty(FAST_INIT_ABOVE, 1, device="meta"))
    mode, why = choose_init("auto", big, check=False)
    assert mode == "fast" and "fast" in why
    assert choose_init("auto", big, check=True)[0] == "exact"
    assert choose_init("exact", big, check=False)[0] == "exact"


def test_small_parameters_without_a_rule_keep_the_constructors_values():
    """Gemma's norm starts at zeros (it scales by 1 + weight): assuming a norm's ones would silently
    double its output. A small parameter no rule covers takes the constructor's value, the same on
    every rank whatever ran before."""
    loaded = load_model(str(MODELS / "own_norms.py"))
    assert {n: r.kind for n, r in model_rules(loaded.build("meta")).items()} == {
        "norm.weight": "given", "gain": "given", "proj.weight": "uniform", "proj.bias": "uniform"}
    model = fast_model(loaded, 5)
    assert torch.equal(model.norm.weight.detach(), torch.zeros(64))
    gain = model.gain.detach()
    assert bool(((gain >= 0.5) & (gain <= 1.5)).all()) and gain.std() > 0.1  # torch.rand(dim) + 0.5
    torch.randn(1000)  # the caller's random stream moved on: the constructor values do not
    assert torch.equal(fast_model(loaded, 5).gain, model.gain)
    assert not torch.equal(fast_model(loaded, 6).gain, model.gain), "the seed changes them"


def test_a_parameter_without_a_known_init_is_refused_in_fast_and_exact_under_auto():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.randn(512, 512))  # too large to copy whole to every rank

    model = Scale().to("meta")
    assert model_rules(model) == {}
    with pytest.raises(GraphsplitError, match="'gain'.*--init exact"):
        choose_init("fast", model, check=False)
