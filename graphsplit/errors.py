"""The one exception type users see.

Every failure graphsplit can explain is a `GraphsplitError` whose message is one
line: what is wrong, where, and what to do. The CLI prints it without a
traceback and exits with code 2.
"""

from __future__ import annotations


class GraphsplitError(Exception):
    """A problem with the user's model, inputs or plan, explained in one line."""

    exit_code = 2

    def __init__(self, message: str, *, detail: str | None = None, exit_code: int | None = None) -> None:
        # One line on purpose: the CLI prints it as `error: <message>`; `detail` (a rank's
        # traceback, say) is printed after that line under --debug alone.
        super().__init__(" ".join(str(message).split()))
        self.detail = detail
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        # Still one line when a framework appends to `args` on the way up (torch.fx's
        # Interpreter adds "While executing ..." lines to the exception it re-raises).
        return " ".join(super().__str__().split())
