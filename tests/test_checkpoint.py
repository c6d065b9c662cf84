"""Activation checkpointing: the same numbers, bit for bit, and less kept for backward."""

import json
import re

import pytest
import torch

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.memory import saved_bytes
from graphsplit.backends.local import LocalPipeline
from graphsplit.ir.meta import info
from graphsplit.loader import load_model
from graphsplit.report.summary import summarize
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.materialize import materialize_stage, model_tensors
from graphsplit.runtime.training import make_loss

from .conftest import EXAMPLES
from .test_cli import cli


def step(loaded, plan):
    program = rewrite_loaded(loaded, plan).program
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


@pytest.mark.parametrize("policy", ["blocks", "every:2", "first:1", "stage", "selective", "selective:2"])
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
    program = rewrite_loaded(loaded, Plan(pp=2, checkpoint="blocks")).program
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


def test_first_n_recomputes_only_the_first_blocks_of_each_stage():
    """first:1 (Megatron's recompute-num-layers): one region per stage, its first block; the other
    blocks keep their activations, so a stage keeps more than under blocks and less than under none."""
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    program = rewrite_loaded(loaded, Plan(pp=2, checkpoint="first:1")).program
    blocks = rewrite_loaded(loaded, Plan(pp=2, checkpoint="blocks")).program
    for st, st_blocks in zip(program.stages, blocks.stages):
        calls = [n for n in st.gm.graph.nodes if n.op == "call_module" and str(n.target).startswith("ckpt_")]
        assert len(calls) == 1
        inputs = st.input_examples()
        assert saved_bytes(st_blocks.gm, inputs) < saved_bytes(st.gm, inputs) < saved_bytes(st.gm, inputs,
                                                                                              checkpointing=False)
    assert ckpt_calls(program)[0][1] == "h.0" and ckpt_calls(program)[1][1] == "h.2"
    with pytest.raises(GraphsplitError, match="first:N takes N"):
        Plan(checkpoint="first:0")


def test_selective_2_keeps_every_other_matmul_output_between_selective_and_blocks():
    """torchtitan's op-level policy: each block keeps its attention outputs and the 1st, 3rd, ... of its
    matmul outputs (counted apart in the forward and the recompute), so a stage keeps less than under
    `selective` and more than under `blocks`."""
    from graphsplit.ops.activation_checkpoint import SelectiveKeeps

    aten = torch.ops.aten
    keeps = SelectiveKeeps(2)
    order = [aten.mm.default, aten.add.Tensor, aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
             aten.addmm.default, aten.mm.default]
    assert [keeps.keeps(op) for op in order] == [True, False, False, True, True, False]
    assert [keeps.keeps(op, recompute=True) for op in order] == [True, False, False, True, True, False]
    loaded = load_model(str(EXAMPLES / "llama.py"))
    kept = {}
    for policy in ("selective", "selective:2", "blocks"):
        program = rewrite_loaded(loaded, Plan(pp=2, checkpoint=policy)).program
        kept[policy] = [saved_bytes(st.gm, st.input_examples()) for st in program.stages]
    for s in range(2):
        assert kept["blocks"][s] < kept["selective:2"][s] < kept["selective"][s], kept
    with pytest.raises(GraphsplitError, match="selective:K takes K"):
        Plan(checkpoint="selective:0")


@pytest.mark.parametrize("example", ["gpt.py", "llama.py"])
def test_stage_policy_keeps_only_the_stage_inputs(example):
    loaded = load_model(str(EXAMPLES / example))
    program = rewrite_loaded(loaded, Plan(pp=2, checkpoint="stage")).program
    for st in program.stages:
        inputs = st.input_examples()
        # the tensors the stage's one region reads, no more than the stage inputs (llama's second
        # stage takes the token ids only for their length, computing the RoPE tables' slices inside)
        (call,) = [n for n in st.gm.graph.nodes if n.op == "call_module" and str(n.target).startswith("ckpt_")]
        region_inputs = sum(info(a).tensor.nbytes for a in call.all_input_nodes if info(a).tensor is not None)
        assert saved_bytes(st.gm, inputs) == region_inputs <= sum(t.numel() * t.element_size() for t in inputs)


def test_a_region_returns_no_value_computed_from_weights_alone():
    """A weight's cast inside a region that a later stage reads (FSDP's bf16 norm weight cast to fp32)
    or a buffer's slice (the RoPE tables cut to the sequence) is recomputed by the stage that reads it,
    not returned and sent: a weight's gradient would then reach it only through the send, which
    torch's split backward never follows (run --check under zero-bubble found
    layers.2.attention_norm.weight without a gradient)."""
    loaded = load_model(str(EXAMPLES / "llama.py"))
    plan = Plan(pp=2, tp=2, dp=2, fsdp=True, autocast="bf16", checkpoint="stage", schedule="zero-bubble",
                stages_per_rank=2)
    program = rewrite_loaded(loaded, plan).program
    recomputed = 0
    for _, _, region in ckpt_calls(program):
        graph = region.inner.graph
        from_inputs: set = set()
        for node in graph.nodes:  # tensors computed from the region's inputs (not just their sizes)
            if info(node).value == "scalar":
                continue
            if node.op == "placeholder" or any(a in from_inputs for a in node.all_input_nodes):
                from_inputs.add(node)
        (outputs,) = [n.args[0] for n in graph.nodes if n.op == "output"]
        assert all(o in from_inputs for o in outputs), [o.name for o in outputs if o not in from_inputs]
        # nor computed in the region for nothing, nor a weight held for it (unused sizes the model reads stay)
        assert all(n.users for n in graph.nodes if n.op == "get_attr" or info(n).value == "tensor")
        # the regions that read a weight's cast compute it from the weight (nor is it a kept input)
        recomputed += sum(1 for n in graph.nodes if n.op == "call_method" and n.target == "to"
                          and all(a.op == "get_attr" for a in n.all_input_nodes))
    assert recomputed >= 1


def ckpt_calls(program):
    """(stage, unit, CheckpointRegion) of every checkpointed region, in order."""
    return [(st.index, info(n).extra["unit"], st.gm.get_submodule(str(n.target)))
            for st in program.stages for n in st.gm.graph.nodes
            if n.op == "call_module" and str(n.target).startswith("ckpt_")]


def test_blocks_take_the_tail_and_keep_only_region_inputs():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    program = rewrite_loaded(loaded, Plan(pp=2, split_at=("h.2",), checkpoint="blocks")).program
    last = program.stages[-1]
    # ln_f and lm_head joined h.3's region: nothing runs outside a region in the last stage
    assert not [n for n in last.gm.graph.nodes if n.op == "call_module" and not str(n.target).startswith("ckpt_")]
    assert {"ln_f", "lm_head"} <= set(last.modules)
    for st in program.stages:
        gm = st.gm
        kept = {a for n in gm.graph.nodes if n.op == "call_module" and str(n.target).startswith("ckpt_")
                for a in n.all_input_nodes if info(a).tensor is not None}
        # outside the regions only the embeddings run (stage 0); they keep their index tensors
        kept |= {n.args[0] for n in gm.graph.nodes
                 if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), torch.nn.Embedding)}
        assert saved_bytes(gm, st.input_examples()) == sum(info(a).tensor.nbytes for a in kept)


def test_batchnorm_statistics_are_updated_once():
    loaded = load_model(str(EXAMPLES / "resnet.py"))

    def buffers(plan):
        program = rewrite_loaded(loaded, plan).program
        model = loaded.build("cpu", seed=0)
        stages = [materialize_stage(s, "cpu", model_tensors(model)) for s in program.stages]
        LocalPipeline(program, stages, make_loss(program, loaded.loss_fn)).step(
            program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
        return {c: m.get_buffer(k) for st, m in zip(program.stages, stages) for k, c in st.buffer_sources.items()}

    plain, recomputed = buffers(Plan(pp=2)), buffers(Plan(pp=2, checkpoint="blocks"))
    assert any("running_mean" in k for k in plain)
    assert [k for k in plain if not torch.equal(plain[k], recomputed[k])] == []


OVERRIDES = [
    ("blocks", (("*.0", "none"), ("*.1*", "selective"))),
    ("none", (("*.att*", "full"), ("*.2", "selective"))),
    ("every:2", (("*.3", "none"),)),
]


@pytest.mark.parametrize("policy, overrides", OVERRIDES, ids=["blocks-0none-1sel", "attn-full-2sel", "every2-3none"])
@pytest.mark.parametrize("example", ["gpt.py", "llama.py"])
def test_overrides_are_bit_identical(example, policy, overrides):
    loaded = load_model(str(EXAMPLES / example))
    _, loss, grads = step(loaded, Plan(pp=2))
    program, loss_ck, grads_ck = step(loaded, Plan(pp=2, checkpoint=policy, checkpoint_overrides=overrides))
    assert ckpt_calls(program)
    assert torch.equal(loss, loss_ck)
    assert grads.keys() == grads_ck.keys()
    for name in grads:
        assert torch.equal(grads[name], grads_ck[name]), name


def test_overrides_choose_the_regions():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    plan = Plan(pp=2, checkpoint="blocks", checkpoint_overrides=(("h.0", "none"), ("h.1*", "selective")))
    program = rewrite_loaded(loaded, plan).program
    found = {unit: region.selective for _, unit, region in ckpt_calls(program)}
    assert found == {"h.1": True, "h.2": False, "h.3": False}
    assert 'getattr(self.h, "0").ln_1(' in program.stages[0].gm.code  # h.0 runs plainly in stage code

    # the last matching override wins; a glob may name modules inside blocks
    plan = Plan(pp=2, checkpoint_overrides=(("h.*", "selective"), ("h.2", "full"), ("h.3.mlp", "full")))
    found = [(unit, region.selective) for _, unit, region in ckpt_calls(rewrite_loaded(loaded, plan).program)]
    # (h.3's residual add after its mlp is left alone: a region without FLOPs is not worth wrapping)
    assert found == [("h.0", True), ("h.1", True), ("h.2", False), ("h.3", True), ("h.3.mlp", False)]

    plan = Plan(pp=2, checkpoint_overrides=(("h.*.mlp", "full"),))
    assert [unit for _, unit, _ in ckpt_calls(rewrite_loaded(loaded, plan).program)] == [f"h.{i}.mlp" for i in range(4)]


def test_override_glob_that_matches_nothing_is_an_error():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    with pytest.raises(GraphsplitError, match=r"Plan\.checkpoint_overrides: 'h\.9' matches no module; modules are e\.g\. .*h\.0"):
        rewrite_loaded(loaded, Plan(pp=2, checkpoint="blocks", checkpoint_overrides=(("h.9", "none"),)))


def test_summary_reports_saved_bytes_with_overrides():
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    plan = Plan(pp=2, checkpoint_overrides=(("h.1", "selective"), ("h.3", "full")))
    rows = summarize(rewrite_loaded(loaded, plan).program)["activation_bytes"]
    assert [r["stage"] for r in rows] == [0, 1]
    assert all(0 < r["with"] < r["without"] for r in rows)


def test_cli_checkpoint_module_option(tmp_path):
    r = cli("transform", EXAMPLES / "gpt.py", "--pp", "2", "--checkpoint", "blocks", "--checkpoint-module", "h.0=none",
            "--checkpoint-module", "h.1*=selective", "--json", "--out", tmp_path / "gpt")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["plan"]["checkpoint_overrides"] == [["h.0", "none"], ["h.1*", "selective"]]
    assert all(row["with"] < row["without"] for row in summary["activation_bytes"])
    record = json.loads((tmp_path / "gpt" / "plan.json").read_text())
    assert Plan.from_dict(record["plan"]).checkpoint_overrides == (("h.0", "none"), ("h.1*", "selective"))
    assert "ckpt_" in (tmp_path / "gpt" / "stage_1.py").read_text()


@pytest.mark.parametrize("value, message", [
    ("h.9=none", r"'h\.9' matches no module; modules are e\.g\. "),
    ("h.0", r"--checkpoint-module takes GLOB=POLICY"),
    ("h.0=sometimes", r"Plan\.checkpoint_overrides: unknown policy 'sometimes'"),
])
def test_cli_bad_checkpoint_module_is_a_one_line_error(tmp_path, value, message):
    r = cli("transform", EXAMPLES / "gpt.py", "--pp", "2", "--checkpoint-module", value, "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(message, lines[0]), r.stderr
    assert not (tmp_path / "out").exists()


def test_fsdp_with_one_stage_runs_each_block_as_a_region_of_its_own():
    """FSDP shards a module per unit: with one stage and no checkpointing each block becomes `block_N`,
    run plainly (nothing recomputed, nothing less kept, the same numbers bit for bit), and `transform`'s
    summary lists the units; under a split-backward schedule a stage is one unit, and no block is wrapped."""
    from graphsplit.ops.activation_checkpoint import CheckpointRegion

    loaded = load_model(str(EXAMPLES / "llama.py"))
    program, loss, grads = step(loaded, Plan(dp=2, fsdp=True))
    _, plain_loss, plain_grads = step(loaded, Plan(dp=2))
    st = program.stages[0]
    regions = {name: m for name, m in st.gm.named_children() if isinstance(m, CheckpointRegion)}
    assert sorted(regions) == [f"block_{i}" for i in range(4)] and not any(m.recompute for m in regions.values())
    assert torch.equal(loss, plain_loss) and grads.keys() == plain_grads.keys()
    assert all(torch.equal(grads[name], plain_grads[name]) for name in grads)
    inputs = st.input_examples()
    assert saved_bytes(st.gm, inputs) == saved_bytes(st.gm, inputs, checkpointing=False)
    assert summarize(program)["fsdp_units"] == [{"stage": 0, "regions": sorted(regions), "reshard_after_forward": True}]
    zero_bubble = rewrite_loaded(loaded, Plan(dp=2, pp=2, fsdp=True, schedule="zbv", stages_per_rank=2)).program
    assert not any(isinstance(m, CheckpointRegion) for st in zero_bubble.stages for m in st.gm.modules())
    assert all(u["regions"] == [] for u in summarize(zero_bubble)["fsdp_units"])  # transform says: one unit
