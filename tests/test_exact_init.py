"""Each rank runs the constructor keeping only its parameters; the values equal the whole model's init."""

import pytest
import torch

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.loader import load_model
from graphsplit.runtime.exact_init import exact_build, exact_init_works

from .conftest import EXAMPLES, MODELS

MODELS_WITH_OWN_INIT = [EXAMPLES / f for f in ("gpt.py", "llama.py", "bert.py", "resnet.py", "unet.py", "mlp.py")] + [
    MODELS / f for f in ("last_input.py", "hf_gpt2.py", "hf_llama.py")]


@pytest.mark.parametrize("path", MODELS_WITH_OWN_INIT, ids=lambda p: p.name)
def test_kept_parameters_equal_the_whole_models_init(path):
    loaded = load_model(str(path))
    full = loaded.build("cpu", seed=7)
    params = dict(full.named_parameters())
    names = sorted(params)
    keep = set(names[1::3])  # every third tensor: a rank's share, scattered across the model
    got = exact_build(loaded, 7, keep)
    for name in keep:
        assert torch.equal(got[name], params[name]), name
    dropped = [n for n in names if n not in keep]
    assert not any(n in got for n in dropped), "a dropped parameter was kept"
    for name, buf in full.named_buffers():
        assert torch.equal(got[name], buf), name
    assert exact_init_works(loaded)


def test_init_code_that_reads_a_dropped_tensor_is_detected():
    loaded = load_model(str(MODELS / "init_reads.py"))
    assert not exact_init_works(loaded)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_falls_back_when_exact_init_cannot():
    """(tests/test_distributed.py's runs use exact init: each checks for its line.)"""
    lines: list[str] = []
    cmp = run_training(str(MODELS / "init_reads.py"), Plan(pp=2), RunOptions(steps=2, check=True), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("built once here" in line for line in lines)


def test_parameters_are_swapped_through_torchs_registration_hook_not_a_patch():
    from torch.nn.modules import module as torch_module

    original = torch.nn.Module.register_parameter
    loaded = load_model(str(EXAMPLES / "llama.py"))
    shell = loaded.build_buffers_only()  # parameters on meta, buffers real: the constructor ran on CPU
    assert all(p.device.type == "meta" for p in shell.parameters())
    full = loaded.build("cpu", seed=0)
    buffers = dict(full.named_buffers())
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in shell.named_buffers())
    exact_build(loaded, 0, set())
    assert torch.nn.Module.register_parameter is original
    assert not torch_module._global_parameter_registration_hooks, "the hooks are removed afterwards"
