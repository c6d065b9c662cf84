"""One front end for the program and the planner (graphsplit/front_end.py): the planner's profile
starts from the graph the compiler builds, so what the front end does to it (the batch found, embedding
bags reading their piece's offsets) is priced as it runs, and the planner's cost passes are the
compiler's own, named as a group."""

from graphsplit.loader import load_model
from graphsplit.ops.bags import own_offsets
from graphsplit.plan import Plan
from graphsplit.planner.profile import start_profile
from graphsplit.rewrite import PASSES, pass_group, rewrite_loaded

from .conftest import MODELS


def test_the_planner_prices_the_graph_the_front_end_builds():
    loaded = load_model(str(MODELS / "bag_features.py"))
    profile = start_profile(loaded)
    rebased = [n for n in profile.source.base.graph.nodes if n.target is own_offsets]
    program = rewrite_loaded(loaded, Plan()).program
    compiled = [n for stage in program.stages for n in stage.gm.graph.nodes if n.target is own_offsets]
    assert len(rebased) == len(compiled) == 2
    assert profile.batch == program.batch.size == 8


def test_the_cost_passes_are_the_compilers_in_its_order():
    names = [name for name, _ in pass_group("cost")]
    assert names == ["grad_mode", "tensor_parallel", "vocab_parallel_loss"]
    order = [name for name, _ in PASSES]
    assert [order.index(n) for n in names] == sorted(order.index(n) for n in names)
    assert all(fn is dict(PASSES)[name] for name, fn in pass_group("cost"))
