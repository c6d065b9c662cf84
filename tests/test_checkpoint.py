"""Activation checkpointing: the same numbers, bit for bit, and less kept for backward."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.analysis.memory import saved_bytes
from graphsplit.backends.local import LocalPipeline
from graphsplit.compile import compile_loaded
from graphsplit.loader import load_model
from graphsplit.materialize import materialize_stage, model_tensors
from graphsplit.meta import info
from graphsplit.runtime import make_loss

from .conftest import EXAMPLES


def step(loaded, plan):
    program = compile_loaded(loaded, plan).program
    model = loaded.build("cpu", seed=0)
    stages = [materialize_stage(s, "cpu", model_tensors(model)) for s in program.stages]
    loss, _ = LocalPipeline(program, stages, make_loss(program, loaded.loss_fn)).step(
        program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target
    )
    grads = {}
    for st, module in zip(program.stages, stages):
        for local, canonical in st.param_sources.items():
            grads[canonical] = module.get_parameter(local).grad
    return program, loss, grads


@pytest.mark.parametrize("policy", ["blocks", "every:2", "stage", "selective"])
@pytest.mark.parametrize("example", ["gpt.py", "llama.py"])
def test_checkpointing_is_bit_identical(example, policy):
    loaded = load_model(str(EXAMPLES / example))
    _, loss, grads = step(loaded, Plan(pp=2))
    program, loss_ck, grads_ck = step(loaded, Plan(pp=2, checkpoint=policy))
    assert any("ckpt_" in st.gm.code for st in program.stages), "regions were wrapped"
    assert torch.equal(loss, loss_ck)
    assert grads.keys() == grads_ck.keys()
    for name in grads:
        assert torch.equal(grads[name], grads_ck[name]), name


def test_blocks_keep_one_region_per_block_and_save_little():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    program = compile_loaded(loaded, Plan(pp=2, checkpoint="blocks")).program
    calls = [n for st in program.stages for n in st.gm.graph.nodes if n.op == "call_module" and str(n.target).startswith("ckpt_")]
    assert len(calls) == 4  # h.0 .. h.3
    for st in program.stages:
        inputs = st.input_examples()
        without = saved_bytes(st.gm, inputs, checkpointing=False)
        with_blocks = saved_bytes(st.gm, inputs)
        region_inputs = {a for n in st.gm.graph.nodes if n.op == "call_module" and str(n.target).startswith("ckpt_")
                         for a in n.all_input_nodes if info(a).tensor is not None}
        lower = sum(info(a).tensor.nbytes for a in region_inputs)
        assert lower <= with_blocks < 0.2 * without


@pytest.mark.parametrize("example", ["gpt.py", "llama.py"])
def test_stage_policy_keeps_only_the_stage_inputs(example):
    loaded = load_model(str(EXAMPLES / example))
    program = compile_loaded(loaded, Plan(pp=2, checkpoint="stage")).program
    for st in program.stages:
        inputs = st.input_examples()
        assert saved_bytes(st.gm, inputs) == sum(t.numel() * t.element_size() for t in inputs)
