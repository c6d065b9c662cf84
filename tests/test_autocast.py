"""The autocast pass: matmuls in bf16 with fp32 parameters; norms, softmax and the
loss in fp32, checked on the nodes' dtypes; the loss close to fp32's."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.backends.local import LocalPipeline
from graphsplit.ir.meta import info
from graphsplit.ir.op_kinds import OpKind
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.materialize import materialize_stage, model_tensors
from graphsplit.runtime.training import make_loss

from .conftest import EXAMPLES


@pytest.mark.parametrize("example, plan", [("gpt.py", Plan(pp=2, tp=2, autocast="bf16")),
                                           ("resnet.py", Plan(pp=2, autocast="bf16")),
                                           ("gpt.py", Plan(pp=2, tp=2, autocast="fp16"))])
def test_node_dtypes(example, plan):
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[plan.autocast]
    program = rewrite_loaded(load_model(str(EXAMPLES / example)), plan).program
    dtypes: dict[OpKind, set] = {}
    for st in program.stages:
        for n in st.gm.graph.nodes:
            if info(n).tensor is not None and n.op != "placeholder":
                dtypes.setdefault(info(n).kind, set()).add(info(n).tensor.dtype)
    compute = dtypes.get(OpKind.LINEAR, set()) | dtypes.get(OpKind.MATMUL, set()) | dtypes.get(OpKind.CONV, set())
    assert compute == {low}
    assert dtypes[OpKind.NORM] == {torch.float32}
    last = program.stages[-1].gm.graph
    (out,) = [n for n in last.nodes if n.op == "output"]
    leaves = out.args[0] if isinstance(out.args[0], tuple) else (out.args[0],)
    assert all(info(leaf).tensor.dtype == torch.float32 for leaf in leaves)  # the loss sees fp32
    assert all(p.dtype == torch.float32 for st in program.stages for p in st.gm.parameters())


def test_bf16_loss_is_close_to_fp32():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("cpu", seed=0)
    losses = {}
    for name in (None, "bf16"):
        program = rewrite_loaded(loaded, Plan(pp=2, autocast=name)).program
        stages = [materialize_stage(s, "cpu", model_tensors(model)) for s in program.stages]
        pipe = LocalPipeline(program, stages, make_loss(program, loaded.loss_fn))
        losses[name], _ = pipe.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
        assert all(p.grad.dtype == torch.float32 for s in stages for p in s.parameters() if p.grad is not None)
    assert losses["bf16"] != losses[None]  # the matmuls did run in bf16
    assert abs(float(losses["bf16"] - losses[None])) <= 1e-2 * abs(float(losses[None]))
