"""transform --device-map: graphsplit's balanced split as single-process model parallelism (HF's
device_map, accelerate.dispatch_model)."""

from __future__ import annotations

import json

import pytest
import torch
from accelerate import dispatch_model

from graphsplit import Plan
from graphsplit.api import transform
from graphsplit.loader import load_model
from graphsplit.report.device_map import device_map

from .conftest import EXAMPLES, MODELS
from .test_cli import cli


def _covers(model: torch.nn.Module, found: dict[str, int]) -> dict[str, int]:
    """Each parameter and buffer of `model` -> the device of the one key that names it or a module above it."""
    placed = {}
    for name, _ in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        keys = [k for k in found if k == "" or name == k or name.startswith(k + ".")]
        assert len(keys) == 1, (name, keys)
        placed[name] = found[keys[0]]
    return placed


@pytest.mark.parametrize("pp", [2, 4])
def test_blocks_stay_whole_in_order_and_tied_weights_together(pp):
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    model = loaded.build("meta")
    found = device_map(transform(loaded, Plan(pp=pp)).program, model)
    placed = _covers(model, found)
    assert sorted(set(found.values())) == list(range(pp))  # every device holds something
    blocks = [placed[f"h.{i}.attn.c_attn.weight"] for i in range(len(model.h))]
    assert blocks == sorted(blocks)  # the blocks fill the devices in order
    # no block is cut: all of a block's tensors on its device
    for i in range(len(model.h)):
        assert {d for n, d in placed.items() if n.startswith(f"h.{i}.")} == {blocks[i]}
    assert placed["wte.weight"] == placed["lm_head.weight"] == 0  # tied: where it is first used
    assert placed["ln_f.weight"] == pp - 1


@pytest.mark.parametrize("name", ["hf_llama", "hf_gpt2"])
def test_an_hf_model_dispatched_with_it_computes_what_the_untouched_model_computes(name, tmp_path):
    """On this CPU machine the two devices are the CPU and accelerate's disk offload: each module's
    weights live where the map says and its inputs are moved there, as on two GPUs."""
    loaded = load_model(str(MODELS / f"{name}.py"))
    found = device_map(transform(loaded, Plan(pp=2)).program, loaded.build("meta"))
    assert set(found.values()) == {0, 1}
    model = loaded.build("cpu", seed=0).eval()
    with torch.no_grad():
        want = model(**loaded.kwargs).logits
    where = {key: ("cpu" if device == 0 else "disk") for key, device in found.items()}
    # as dispatch_model takes it
    copy = loaded.build("cpu", seed=0).eval()
    copy.load_state_dict(model.state_dict())
    dispatched = dispatch_model(copy, where, main_device="cpu", offload_dir=str(tmp_path / "offload"))
    with torch.no_grad():
        assert torch.equal(dispatched(**loaded.kwargs).logits, want)
    # and as from_pretrained(device_map=...) takes it
    model.save_pretrained(tmp_path / "saved")
    loaded_again = type(model).from_pretrained(tmp_path / "saved", device_map=where,
                                               offload_folder=str(tmp_path / "offload2")).eval()
    with torch.no_grad():
        assert torch.equal(loaded_again(**loaded.kwargs).logits, want)


def test_transform_writes_it_and_refuses_plans_it_cannot_express(tmp_path):
    out = tmp_path / "map.json"
    result = cli("transform", str(EXAMPLES / "gpt.py"), "--pp", "2", "--device-map", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["h.0"] == 0
    for args, says in ((["--pp", "2", "--tp", "2"], "use it with --pp alone"),
                       (["--pp", "2", "--dp", "2"], "use it with --pp alone")):
        bad = tmp_path / "bad.json"
        result = cli("transform", str(EXAMPLES / "gpt.py"), *args, "--device-map", str(bad))
        assert result.returncode == 2 and says in result.stderr and not bad.exists()
    result = cli("transform", str(EXAMPLES / "gpt.py"), "--pp", "2", "--device-map", str(tmp_path / "no" / "m.json"))
    assert result.returncode == 2 and "does not exist" in result.stderr
