"""One architecture of the zoo (tests/models/zoo.py) as a model file, picked by ZOO_ARCH (the
zoo's row name; the ranks torchrun starts inherit it):

    ZOO_ARCH=T5 graphsplit run tests/models/zoo_model.py --tp 2 --pp 2 --check
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402

_NAME = os.environ.get("ZOO_ARCH", "T5")
if _NAME not in zoo.BY_NAME:
    raise ValueError(f"ZOO_ARCH={_NAME!r} is no row of the zoo; one of {', '.join(zoo.BY_NAME)}")
ARCH = zoo.BY_NAME[_NAME]


def build_model():
    return zoo.build(ARCH)


def example_inputs():
    return zoo.example(ARCH)[0]


def example_target():
    return zoo.example(ARCH)[1]


def loss_fn(output, target):
    return zoo.loss_of(ARCH)(output, target)
