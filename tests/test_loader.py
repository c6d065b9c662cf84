import pytest
import torch

from graphsplit import GraphsplitError
from graphsplit.loader import load_model


def test_loads_convention_and_factory_suffix(examples_dir, models_dir):
    loaded = load_model(str(examples_dir / "gpt.py"))
    assert loaded.factory == "build_model"
    assert loaded.loss_fn is not None and loaded.target is not None
    model = loaded.build("meta")
    assert all(p.device.type == "meta" for p in model.parameters())

    sibling = load_model(f"{models_dir / 'sibling.py'}:make_tiny")  # imports tiny.py beside it
    assert sibling.build("cpu").lin.weight.shape == (4, 4)


def test_keyword_inputs(models_dir):
    loaded = load_model(str(models_dir / "last_input.py"))
    assert loaded.args == () and set(loaded.kwargs) == {"x", "scale"}


def test_seeded_builds_are_identical(examples_dir):
    loaded = load_model(str(examples_dir / "mlp.py"))
    a, b = loaded.build("cpu", seed=3), loaded.build("cpu", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_builder.py", r"defines no build_model\(\)"),
        ("tiny.py:make_it", r"defines no make_it\(\)"),
        ("missing.py", "does not exist"),
    ],
)
def test_missing_pieces_are_named(models_dir, spec, message):
    path, _, factory = spec.partition(":")
    with pytest.raises(GraphsplitError, match=message):
        load_model(str(models_dir / path) + (f":{factory}" if factory else ""))


def test_broken_example_inputs_are_reported(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\ndef example_inputs():\n    return 3\n")
    with pytest.raises(GraphsplitError, match="returned int"):
        load_model(str(f))
    f.write_text("def build_model():\n    return 1\ndef example_inputs():\n    raise ValueError('boom')\n")
    with pytest.raises(GraphsplitError, match=r"example_inputs\(\) in .* failed: ValueError: boom \(m.py:4\)"):
        load_model(str(f))
