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


def test_every_product_torch_autocasts_runs_in_the_low_dtype(tmp_path):
    """baddbmm (its added tensor too: BLOOM's fp32 ALiBi bias beside bf16 q and k) and `Tensor.mm` cast every
    input as torch.autocast does, where leaving one in fp32 fails ("Input dtypes must be the same"); the
    program matches the untouched model under torch.autocast."""
    from graphsplit.launch.parity import check_locally

    path = tmp_path / "products.py"
    path.write_text('''import torch
import torch.nn as nn


class Products(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8, bias=False), nn.Linear(8, 8)  # softmax ignores a key bias
        self.w = nn.Parameter(torch.randn(8, 8) / 8)

    def forward(self, x):
        bias = torch.arange(x.shape[1], dtype=torch.float32).expand(x.shape[0], 1, -1) * -0.1
        scores = torch.baddbmm(bias, self.q(x), self.k(x).transpose(1, 2), alpha=0.3)
        y = torch.bmm(scores.softmax(-1), self.v(x))
        z = y.flatten(0, 1).mm(self.w)
        return z


def build_model():
    torch.manual_seed(0)
    return Products()


def example_inputs():
    return (torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0)),)


def loss_fn(out):
    return out.square().mean()
''')
    loaded = load_model(str(path))
    program, cmp = check_locally(loaded, Plan(autocast="bf16"))
    assert cmp.ok, cmp.failures
    products = [n for st in program.stages for n in st.gm.graph.nodes
                if info(n).kind in (OpKind.ADD_MATMUL, OpKind.MATMUL)]
    assert {str(getattr(n.target, "__name__", n.target)) for n in products} == {"baddbmm", "bmm", "mm"}
    for n in products:
        assert info(n).tensor.dtype == torch.bfloat16, n
        assert all(info(a).tensor.dtype == torch.bfloat16 for a in n.all_input_nodes if info(a).tensor is not None), n


def test_x_transformers_trains_in_bf16_with_its_rotary_kept_out_of_autocast():
    """lucidrains' x-transformers, unchanged: its rotary embedding runs under `@autocast('cuda', enabled=False)`,
    which torch.export records as a region: inlined (tp then shards q and k through it), its ops marked to stay
    as written under --autocast; its attention mask fills with `-torch.finfo(sim.dtype).max` traced in fp32,
    a number bf16 cannot hold, so that fill reads its scores in fp32 (it overflowed); its einsums run in bf16,
    as torch.autocast runs the bmm they become (they failed on mixed dtypes)."""
    from graphsplit.ir.grad_regions import AUTOCAST_OFF
    from graphsplit.launch.parity import check_locally

    from .conftest import MODELS

    loaded = load_model(str(MODELS / "outside" / "x_transformers_tiny.py"))
    program, cmp = check_locally(loaded, Plan(tp=2, autocast="bf16"))
    assert cmp.ok, cmp.failures
    assert program.param_sharding("net.attn_layers.layers.0.1.to_q.weight") is not None, program.replicated
    assert any(info(n).extra.get(AUTOCAST_OFF) for st in program.stages for n in st.gm.graph.nodes)
