"""Training from a weights file: each rank reads only its shards; buffers no file holds
(causal masks, RoPE tables) come from the constructor run with parameters on meta."""

import pytest
import torch
from safetensors.torch import save_file

from graphsplit import GraphsplitError, Plan
from graphsplit.backends.local import LocalProgram
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.parity import RankStep, check_ranks
from graphsplit.launch.reference import reference_step
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.weights import open_weights

from .conftest import EXAMPLES, MODELS


def test_buffers_only_build_keeps_real_buffers_and_meta_parameters():
    loaded = load_model(str(EXAMPLES / "llama.py"))
    lean = loaded.build_buffers_only()
    full = loaded.build("cpu", seed=0)
    assert {p.device.type for p in lean.parameters()} == {"meta"}
    lean_buffers = dict(lean.named_buffers())
    assert lean_buffers and all(b.device.type == "cpu" for b in lean_buffers.values())
    for name, buf in full.named_buffers():
        assert torch.equal(lean_buffers[name], buf), name


def test_weights_files_are_read_lazily_and_errors_are_clear(tmp_path):
    model = load_model(str(EXAMPLES / "mlp.py")).build("cpu", seed=0)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    state = open_weights(path)
    assert set(state) == set(model.state_dict())
    assert torch.equal(state["inp.weight"], model.inp.weight)
    with pytest.raises(GraphsplitError, match="does not exist"):
        open_weights(tmp_path / "nope.safetensors")
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(GraphsplitError, match="cannot read"):
        open_weights(tmp_path / "junk.pt")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_from_a_safetensors_file_matches_the_model_holding_it(tmp_path):
    """tp 2 x pp 2 with activation checkpointing on real groups (tests/test_distributed.py's tensor x
    pipeline case): tp collectives between pipeline sends, recomputed in backward, the vocab-parallel
    loss on the last stage; every rank starting from the file."""
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("cpu", seed=123)  # not the plan's seed: the file must be what is used
    path = tmp_path / "gpt.safetensors"
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(path))
    lines: list[str] = []
    opts = RunOptions(steps=2, check=True, timeout_s=240, weights=str(path))
    cmp = run_training(str(EXAMPLES / "gpt.py"), Plan(tp=2, pp=2, checkpoint="blocks"), opts, echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    with torch.no_grad():
        expected = loaded.loss_fn(model(*loaded.args), loaded.target)
    step1 = next(line for line in lines if "loss step 1" in line)
    assert f"{float(expected):.4f}" in step1  # both sides started from the file's values


@pytest.mark.parametrize("spec", ["odd_vocab.py", "odd_vocab.py:build_untied"])
def test_a_weights_file_fills_a_padded_vocabulary(tmp_path, spec):
    """The file holds the model's own (97, 64) tensors; at tp 4 each rank reads its 25 rows (the
    last rank 22 and three zero padding rows) and the step equals the untouched model holding the file."""
    loaded = load_model(str(MODELS / spec))
    model = loaded.build("cpu", seed=123)  # not the plan's seed: the file must be what is used
    path = tmp_path / "w.safetensors"
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(path))
    program = rewrite_loaded(loaded, Plan(tp=4)).program
    buffers = dict(loaded.build_buffers_only().named_buffers())  # as run does: the file holds no causal mask
    local = LocalProgram(program, {**buffers, **open_weights(path)}, loaded.loss_fn)
    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    head = "wte.weight" if spec == "odd_vocab.py" else "lm_head.weight"
    file_head = open_weights(path)[head]
    local_name = next(k for k, c in program.stages[0].param_sources.items() if c == head)
    for rank, pipe in enumerate(local.ranks):
        held = pipe.stages[0].get_parameter(local_name)
        real = 22 if rank == 3 else 25
        assert held.shape == (25, 64) and torch.equal(held[:real], file_head[25 * rank:25 * rank + real])
        assert not held[real:].any()
    steps = local.step(inputs, loaded.target)
    ranks = [RankStep(s.tp_rank, (0,), s.grads, s.loss, s.output, s.tp_rank) for s in steps]
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, program.plan.num_microbatches)
    cmp = check_ranks(program, ranks, ref)
    assert cmp.ok, cmp.failures
    assert f"grad {head} (rank 3)" in cmp.max_diff
