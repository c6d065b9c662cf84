"""Folders written whole or not at all, and never over a folder graphsplit did not write.

A command that writes a folder (`transform --out`, `run --save`) first checks
`require_replaceable`: the target is missing, an empty folder, or a folder
graphsplit wrote (the caller says how to recognize one); anything else is
refused before any work, and nothing is touched. It then fills a temporary
sibling and swaps it into place. A file-system failure (a read-only parent, a
path through a file) becomes one `GraphsplitError` naming the path, and no
`.NAME.tmp-*` or `.NAME.old-*` folder is left behind.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import GraphsplitError


def cannot_write(final: Path, exc: OSError, label: str = "") -> GraphsplitError:
    """One line for a file-system failure while writing `final`."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(final) else ""
    return GraphsplitError(f"cannot write {label + ' ' if label else ''}{final}: {exc.strerror or exc}{where}; "
                           "choose a folder you can write to")


def require_replaceable(final: Path, is_ours: Callable[[Path], bool], label: str, what: str) -> None:
    """Refuse `final` unless it is missing, an empty folder, or `is_ours` (a folder graphsplit wrote).

    `label` names the option (`--out`), `what` the kind of folder graphsplit writes there
    (`transform output`). Also refuses, up front, a path that cannot be created: one
    that runs through a file, or whose nearest existing folder is not writable."""
    final = Path(final)
    if final.exists() or final.is_symlink():
        if not final.is_dir():
            raise GraphsplitError(f"{label} {final} exists and is not a folder; choose another path")
        entries = sorted(p.name for p in final.iterdir())
        if entries and not is_ours(final):
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise GraphsplitError(
                f"{label} {final} is a folder graphsplit did not write (it holds {shown}); graphsplit only "
                f"writes into a new or empty folder or replaces its own {what}: choose another folder"
            )
    existing = final.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise GraphsplitError(f"cannot write {label} {final}: {existing} is a file, not a folder; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise GraphsplitError(f"cannot write {label} {final}: {existing} is not writable; choose a folder you can write to")


def leftovers(name: str) -> re.Pattern[str]:
    """The names of what a killed write of a folder named `name` (a regex) leaves beside it:
    its temporary (`.NAME.tmp-*`) or the folder it was replacing (`.NAME.old-*`)."""
    return re.compile(rf"\.{name}\.(tmp|old)-\w+")


def remove_leftovers(parent: Path, name: str) -> None:
    """Remove from `parent` what killed writes of folders named `name` (a regex) left there
    (one run writes a folder at a time, so none of them is in use)."""
    if not parent.is_dir():
        return
    pattern = leftovers(name)
    for entry in parent.iterdir():
        if pattern.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def temporary_sibling(final: Path, label: str = "") -> Path:
    """An empty folder beside `final` (same file system, so the swap is a rename)."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as exc:
        raise cannot_write(final, exc, label) from exc


def swap_into_place(tmp: Path, final: Path, label: str = "") -> None:
    """Rename the finished `tmp` to `final`; an existing `final` stays whole until the rename.

    On failure `final` is as it was (the previous folder is put back) and no `.old-`
    folder remains; the caller removes `tmp`."""
    try:
        tmp.chmod(0o755)  # mkdtemp made it private
        if not (final.exists() or final.is_symlink()):
            os.replace(tmp, final)
            return
        # a sibling in the same folder: renaming within one parent needs no write access to
        # `final` itself (moving a folder into another one would, for its `..` entry)
        old = final.with_name(f".{final.name}.old-{secrets.token_hex(4)}")
        os.replace(final, old)
    except OSError as exc:
        raise cannot_write(final, exc, label) from exc
    try:
        os.replace(tmp, final)
    except OSError as exc:
        os.replace(old, final)  # the previous folder back where it was
        raise cannot_write(final, exc, label) from exc
    shutil.rmtree(old, ignore_errors=True)


def replace_file(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary file beside `path`, which is then renamed into place: `path` is
    whole or as it was, and no temporary is left. Creating the temporary (a folder on the way that
    is a file, one not writable) fails as one GraphsplitError; `write`'s own errors pass through."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already when the rename happened


def write_file_atomically(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all: a temporary file beside it, renamed into place."""
    path = Path(path)
    if path.is_dir():
        raise GraphsplitError(f"{path} is a folder; give a file name")
    replace_file(path, lambda tmp: tmp.write_text(text))
