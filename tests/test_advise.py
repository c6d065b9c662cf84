"""advise: training memory in five parts, the scenario, and a plan that fits."""

import json

import pytest
import torch

from graphsplit import GraphsplitError, Plan
from graphsplit.loader import load_model
from graphsplit.report.advise import advise, estimate, parse_bytes

from .conftest import EXAMPLES
from .test_cli import cli


def measured_saved_bytes(model, args):
    """Bytes autograd keeps for backward on real CPU tensors (distinct storages, parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*args)
    return sum(seen.values()), out


@pytest.mark.parametrize("example", ["gpt.py", "mlp.py", "resnet.py"])
def test_memory_parts_match_measured_bytes(example):
    loaded = load_model(str(EXAMPLES / example))
    est = estimate(loaded, Plan()).memory
    model = loaded.build("cpu", seed=0)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert est["parameters"] == param_bytes and est["gradients"] == param_bytes
    acts, out = measured_saved_bytes(model, loaded.args)
    loaded.loss_fn(out, loaded.target).backward()
    opt = torch.optim.AdamW(model.parameters())
    opt.step()
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.dim() > 0)
    assert est["optimizer_state"] == state
    assert abs(est["activations"] - acts) <= 0.1 * acts


def test_plenty_of_memory_recommends_data_parallel():
    result = advise(load_model(str(EXAMPLES / "gpt.py")), gpus=4, gpu_memory=parse_bytes("80GiB"))
    assert result["fits"] and result["scenario"].startswith("fits on one device")
    chosen = result["recommended"]["plan"]
    assert (chosen["tp"], chosen["pp"], chosen["dp"]) == (1, 1, 4)  # everything fits on each: plain data parallel


def test_nothing_fits_says_how_many_devices_it_would_take():
    r = cli("advise", EXAMPLES / "gpt.py", "--gpus", "2", "--gpu-memory", "1MiB", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["fits"] is False and result["devices_needed"] > 2
    assert {"parameters", "gradients", "optimizer_state", "activations", "outputs_and_loss"} <= set(result["single_device"])


def test_memory_sizes_parse_or_fail_clearly():
    assert parse_bytes("80GiB") == 80 * 2**30 and parse_bytes("40GB") == 40 * 10**9 and parse_bytes("1e9") == 10**9
    with pytest.raises(GraphsplitError, match="cannot read the memory size"):
        parse_bytes("lots")
