"""Per-node analysis on meta: shapes, FLOPs, bytes, parameters."""

import torch
import torch.nn as nn

from graphsplit.analysis.shapes import annotate
from graphsplit.ir.meta import info
from graphsplit.ir.op_kinds import OpKind
from graphsplit.ir.trace import trace_model


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8, bias=False)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h) @ torch.ones(8, 4)


def test_flops_shapes_and_bytes_per_node():
    with torch.device("meta"):
        model = Net()
    x = torch.randn(5, 16)
    t = trace_model(model, (x,), {})
    annotate(t.gm, (x,))
    nodes = {n.name: n for n in t.gm.graph.nodes}
    fc1, fc2, relu = info(nodes["fc1"]), info(nodes["fc2"]), info(nodes["relu"])
    assert fc1.flops == 2 * 5 * 16 * 32
    assert fc2.flops == 2 * 5 * 32 * 8
    assert relu.flops == 0
    matmul = next(info(n) for n in t.gm.graph.nodes if info(n).kind == OpKind.MATMUL)
    assert matmul.flops == 2 * 5 * 8 * 4
    assert fc1.tensor.shape == (5, 32) and fc1.tensor.dtype == torch.float32
    assert fc1.param_bytes == (16 * 32 + 32) * 4
    assert relu.bytes_moved == 2 * 5 * 32 * 4  # reads and writes one (5, 32) fp32 tensor
    assert all(p.device.type == "meta" for p in model.parameters())


def test_analysis_of_a_real_model_touches_no_weights():
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 16)
    t = trace_model(model, (x,), {})
    annotate(t.gm, (x,))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert info(next(n for n in t.gm.graph.nodes if n.name == "fc1")).flops == 2 * 5 * 16 * 32


class Casts(nn.Module):
    def forward(self, x):
        y = x.float().to(torch.float32).type_as(x).contiguous()  # fp32 already: torch returns x itself each time
        y = y + 1
        y.add_(1)  # in place: returns its input too, but reads and writes it
        return y.to(torch.bfloat16)


def test_a_cast_to_the_dtype_a_tensor_has_moves_no_bytes():
    """torch returns the input itself and runs no kernel; priced as a copy, they made a bf16 Llama stage's
    compute 8% slower in the planner's eyes than on an H200 (bench/gpu_stage.py)."""
    x = torch.randn(4, 8)
    t = trace_model(Casts(), (x,), {})
    annotate(t.gm, (x,))
    moved = {n.name: info(n).bytes_moved for n in t.gm.graph.nodes if n.op in ("call_method", "call_function")}
    assert {k: v for k, v in moved.items() if v == 0} == {"float_1": 0, "to": 0, "type_as": 0, "contiguous": 0}
    assert moved["add_"] == 2 * 4 * 8 * 4 and moved["to_1"] == 4 * 8 * (4 + 2)
