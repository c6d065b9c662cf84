"""Sizes that follow the data (analysis/shapes.py, ir/op_kinds.py): a hand-written mixture of experts picks
each expert's tokens with `torch.where(selected == i)` and writes them back with `results[idx] += ...`
(mistral-inference's reference MoeLayer). On meta such an op has no size: the analysis gives it the
largest it can be (every element counted), marks what follows from it, and no stage boundary is put
where such a value would be sent; the batch is routed through the experts and back, as in HF's
mixtures of experts (assumed, said in a note)."""

from graphsplit import Plan
from graphsplit.ir.meta import info
from graphsplit.launch.parity import check_locally

from .conftest import MODELS, traced_once

MODEL = MODELS / "outside" / "mistral_moe_tiny.py"


def test_what_follows_the_data_is_marked_and_never_sent_between_stages():
    loaded, traced = traced_once(MODEL)
    program, cmp = check_locally(loaded, Plan(pp=2), traced=traced.copy())
    assert cmp.ok, cmp.failures
    marked = [n for st in program.stages for n in st.gm.graph.nodes if info(n).sizes_follow_data]
    assert marked and any("where" in n.name or "nonzero" in n.name for n in marked)
    sent = {name for b in program.boundaries for name in b.values}
    by_name = {n.name: n for st in program.stages for n in st.gm.graph.nodes}
    assert sent and not any(info(by_name[name]).sizes_follow_data for name in sent if name in by_name)
    assert any("route each example and bring it back" in note for note in program.batch.notes)
    assert program.plan.num_microbatches == 2
