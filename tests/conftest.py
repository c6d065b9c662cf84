from __future__ import annotations

from pathlib import Path

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
