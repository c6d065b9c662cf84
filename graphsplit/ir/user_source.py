"""Where in the user's code something happened: the model's frame of an exception, of a tracer's
call stack, or of a node's recorded stack trace, never torch's, graphsplit's or the standard
library's (other installed packages, transformers, count as the model's code)."""

from __future__ import annotations

import functools
import os
import re
import sysconfig
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from .meta import SourceLine


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def user_frame(exc: BaseException, source: Path | None) -> str | None:
    """`file:line in function: `code`` of the innermost frame in the user's file, else of the
    innermost frame of the model's code (outside torch, graphsplit and the standard library)."""
    frames = traceback.extract_tb(exc.__traceback__)
    want = source.resolve() if source is not None else None
    mine = [f for f in frames if want is not None and Path(f.filename).resolve() == want]
    model_code = [f for f in frames if not internal(f.filename)]
    for frame in (mine or model_code)[-1:]:
        code = f": `{frame.line.strip()}`" if frame.line else ""
        return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}{code}"
    # torch.export reports the user's frame inside its message
    for line in str(exc).splitlines():
        if source is not None and source.name in line and "line" in line:
            return line.strip()[:200]
    return None


READS_VALUES = ("numpy()", ".item()", ".tolist()", "data-dependent", "data dependent")


def model_frame(exc: BaseException) -> str | None:
    """`file:line` of the innermost frame of the model's code (outside torch and graphsplit), else of the
    torch module it called (nn.TransformerEncoder's own checks), never of the tracers."""
    frames = list(reversed(traceback.extract_tb(exc.__traceback__)))
    tracers = (os.path.dirname(os.path.realpath(fx.__file__)) + os.sep, GRAPHSPLIT_DIR,
               os.path.dirname(os.path.realpath(torch.export.__file__)) + os.sep)
    for frame in (*[f for f in frames if not internal(f.filename)],
                  *[f for f in frames if not os.path.realpath(f.filename).startswith(tracers)]):
        return f"{Path(frame.filename).name}:{frame.lineno}"
    return None


def raised_by_model(exc: BaseException) -> str | None:
    """`file:line` when the exception was raised by the model's own code (its innermost frame is
    outside torch, graphsplit and the installed packages), as export runs it on fake tensors."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or internal(frames[-1].filename):
        return None
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"


TRACE_CODE = fx.Tracer.trace.__code__
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_SITE = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib"))
GRAPHSPLIT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # the package
_OWN = (os.path.dirname(os.path.realpath(torch.__file__)) + os.sep, GRAPHSPLIT_DIR)


@functools.cache
def internal(filename: str) -> bool:
    """True for torch's, graphsplit's and the standard library's files: never the model's line.
    Other installed packages (transformers) count as the model's code."""
    path = os.path.realpath(filename)
    if path.startswith(_OWN) or filename.startswith("<"):
        return True
    return path.startswith(_STDLIB) and not path.startswith(_SITE)


def user_source(frame: Any) -> SourceLine | None:
    """The innermost frame of the model's code between `Tracer.trace` and `frame`."""
    while frame is not None and frame.f_code is not TRACE_CODE:
        code = frame.f_code
        if not internal(code.co_filename):
            return SourceLine(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def source_from_stack_trace(text: str | None) -> SourceLine | None:
    """The innermost model frame of a node's `stack_trace` (what torch.export records)."""
    for file, line, function in reversed(_FRAME.findall(text or "")):
        if os.path.realpath(file).startswith(GRAPHSPLIT_DIR):
            return None  # frames further out are whoever called graphsplit
        if not internal(file):
            return SourceLine(file, int(line), function)
    return None
