"""Atomic JSON files: baselines, results and rank reports are read while they may
be rewritten, so readers must see the old file or the new one, never half of one.

Torch-free leaf, used by both the pytest process and the ranks.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def user_cache(name: str) -> Path:
    """perfsuite's folder ``name`` among this user's caches: ``$XDG_CACHE_HOME/perfsuite/NAME``
    (default ``~/.cache``), what runs keep for later runs on this machine."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "perfsuite" / name


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` through a temp file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; the result keeps the file's mode, or gets what open() would give.
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    # Linux says it in /proc; os.umask can only read it by setting it, which races other threads.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def unwritable(path: Path, folder: bool = False) -> str | None:
    """Why a file (or, with ``folder``, a folder) at ``path`` could not be written (None: it could),
    found before a run measures anything, so that a bad output path does not cost the run. Tried,
    not guessed from permission bits (root passes those everywhere, even on /proc): the folder is
    created if missing, as the write would, and a temporary file is made and removed in it."""
    where = path if folder else path.parent
    if not folder and path.is_dir():
        return f"{path} is a folder"
    existing = where.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        return f"{exc.filename or where}: {exc.strerror or exc}"
    return None


def output_problem(flag: str, given: str | None, folder: bool = False) -> str | None:
    """The usage error for an output flag whose path cannot be written (None: unset, or fine)."""
    problem = unwritable(Path(given), folder) if given else None
    return f"{flag} {given}: cannot write there: {problem}" if problem else None


def atomic_write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` as indented JSON, sorted keys, atomically."""
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
