from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# the suite runs two workers (pytest-xdist) on as many cores, each starting ranks of its own: torch's
# default of one compute thread per core in every process oversubscribes them, and OpenMP's idle threads
# spin. One each (set before torch is imported; the ranks inherit it, as torchrun sets it for its own)
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture
def models_dir() -> Path:
    return MODELS


_TRACES: dict[str, tuple[Any, Any]] = {}


def traced_once(path: Path | str) -> tuple[Any, Any]:
    """(LoadedModel, Traced): a model file loaded and traced once per test session (an HF model's
    export trace costs seconds); `check_locally(loaded, plan, traced=...)` compiles each plan from a
    copy. graphsplit is imported here, not when pytest collects."""
    from graphsplit.loader import load_model
    from graphsplit.rewrite import trace_loaded

    key = str(path)
    if key not in _TRACES:
        loaded = load_model(key)
        _TRACES[key] = (loaded, trace_loaded(loaded))
    return _TRACES[key]


def exported_weights(checkpoint: Path) -> dict[str, Any]:
    """`graphsplit export-weights` of a checkpoint folder, read back: the whole model by its own names."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from graphsplit.cli import main

    out = checkpoint.with_suffix(".safetensors")
    done = CliRunner().invoke(main, ["export-weights", str(checkpoint), str(out)])
    assert done.exit_code == 0, done.output
    return load_file(out)


def untouched_after_sgd_step(spec: str, lr: float) -> tuple[Any, Any, Any]:
    """(LoadedModel, the untouched model, its SGD optimizer) after one step on the whole batch, from the
    constructor's own init with seed 0: what a run of one SGD step at any plan must save."""
    from graphsplit.launch.reference import reference_step
    from graphsplit.loader import load_model
    from graphsplit.runtime.training import make_optimizer

    loaded = load_model(spec)
    model = loaded.build("cpu", seed=0)
    optimizer = make_optimizer("sgd", list(model.parameters()), lr)
    reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn)
    optimizer.step()
    return loaded, model, optimizer
