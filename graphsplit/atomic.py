"""Folders written whole or not at all: fill a temporary sibling, then swap it into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def temporary_sibling(final: Path) -> Path:
    """An empty folder beside `final` (same file system, so the swap is a rename)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))


def swap_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished `tmp` to `final`; an existing `final` stays whole until the rename."""
    tmp.chmod(0o755)  # mkdtemp made it private
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.replace(final, old / "x")
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
