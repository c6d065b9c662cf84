"""How the command line ends on an error: one line on stderr and an exit code (cli.py's docstring
lists them); `--debug` or GRAPHSPLIT_DEBUG=1 adds the traceback."""

from __future__ import annotations

import os
import sys
import traceback

import click

from .errors import GraphsplitError

DEBUG_ENV = "GRAPHSPLIT_DEBUG"
INTERNAL_ERROR_EXIT = 3


_debug_flag = [False]  # `graphsplit --debug`, for this invocation


def set_debug(value: bool, keep: bool = False) -> None:
    """`--debug` for this invocation (`keep`: once set, it stays set)."""
    _debug_flag[0] = (keep and _debug_flag[0]) or value


def debug_enabled() -> bool:
    return _debug_flag[0] or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def fail(exc: GraphsplitError) -> None:
    click.echo(f"error: {exc}", err=True)
    if debug_enabled():  # a rank's traceback (`detail`), then graphsplit's own
        if getattr(exc, "detail", None):
            click.echo(exc.detail.rstrip(), err=True)
        traceback.print_exception(exc, file=sys.stderr)
    sys.exit(exc.exit_code)


def internal(exc: BaseException) -> None:
    """Not the user's input: graphsplit's own bug. Say so, in one line, and how to see and report it."""
    from .report.artifacts import _version

    first = (str(exc).strip().splitlines() or [""])[0][:300]
    click.echo(f"error: internal error in graphsplit {_version()} ({type(exc).__name__}: {first}); this is a bug, "
               f"not your input: please report it with the command line and the traceback "
               f"(graphsplit --debug ... or {DEBUG_ENV}=1 prints it)", err=True)
    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    sys.exit(INTERNAL_ERROR_EXIT)
