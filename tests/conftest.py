from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
    from graphsplit.compile import trace_loaded
    from graphsplit.loader import load_model

    key = str(path)
    if key not in _TRACES:
        loaded = load_model(key)
        _TRACES[key] = (loaded, trace_loaded(loaded))
    return _TRACES[key]
