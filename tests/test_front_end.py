"""One front end for the program and the planner (graphsplit/front_end.py): the planner's profile
starts from the graph and the batch the compiler starts from, and the planner's cost passes are the
compiler's own, named as a group."""

import graphsplit.planner.profile as profile_module
from graphsplit.front_end import front_end
from graphsplit.loader import load_model
from graphsplit.plan import Plan
from graphsplit.planner.profile import start_profile
from graphsplit.rewrite import PASSES, pass_group, rewrite_loaded

from .conftest import MODELS


def test_the_planner_starts_from_the_compilers_front_end(monkeypatch):
    """The planner's profile runs the compiler's own front end: the batch it prices is the one the
    program cuts (here dim 1 of a recommendation model's indices and offsets)."""
    calls = []

    def recording(*args, **kwargs):
        calls.append(front_end(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(profile_module, "front_end", recording)
    loaded = load_model(str(MODELS / "bag_features.py"))
    profile = start_profile(loaded)
    program = rewrite_loaded(loaded, Plan(pp=2)).program
    assert len(calls) == 1 and calls[0].batch.to_dict(calls[0].traced.input_names) == \
        program.batch.to_dict(program.traced.input_names)
    assert profile.batch == program.batch.size == 8
    assert calls[0].batch.inputs == {"dense": 0, "indices": 1, "offsets": 1}


def test_the_cost_passes_are_the_compilers_in_its_order():
    names = [name for name, _ in pass_group("cost")]
    assert names == ["grad_mode", "tensor_parallel", "vocab_parallel_loss"]
    order = [name for name, _ in PASSES]
    assert [order.index(n) for n in names] == sorted(order.index(n) for n in names)
    assert all(fn is dict(PASSES)[name] for name, fn in pass_group("cost"))
