"""The one exception type users see.

Every failure graphsplit can explain is a `GraphsplitError` whose message is one
line: what is wrong, where, and what to do. The CLI prints it without a
traceback and exits with code 2.
"""

from __future__ import annotations


class GraphsplitError(Exception):
    """A problem with the user's model, inputs or plan, explained in one line."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # One line on purpose: the CLI prints it as `error: <message>`.
        super().__init__(" ".join(str(message).split()))
