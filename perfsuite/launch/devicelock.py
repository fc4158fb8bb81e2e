"""One run at a time per GPU on a host.

Two pytest runs that launch on the same GPUs at once would measure each other
and both report nonsense. Every launch on GPUs therefore holds a lock per GPU
for as long as its ranks run: a lock file named after the card's UUID (an index
only where NVML gives none), so that two containers that number one card
differently (each sees its cards from 0) still take the same lock. The folder
is ``--perf-lock-dir`` (ini ``perf_lock_dir``), else ``PERFSUITE_LOCK_DIR``, else
``/tmp/perfsuite-locks``; containers on one host share it by mounting one host
folder there (flock works across containers on one kernel). A second run waits,
saying which run holds the GPU, and gives up with :class:`DeviceBusy` after
``wait_s``. The holder's description sits beside the lock so the waiter can
name it. Locks are ``flock``-based (filelock), so a holder killed by SIGKILL
releases them with its last file descriptor. Pytest side, torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

LOCK_DIR_VAR = "PERFSUITE_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/perfsuite-locks"
POLL_S = 5.0  # how often a waiter says it is still waiting


class DeviceBusy(Exception):
    """A GPU stayed held by another run for the whole wait; the message names it."""


def lock_dir(folder: Path | None = None) -> Path:
    """``folder``, else ``PERFSUITE_LOCK_DIR``, else the default; created, shared by every user."""
    folder = folder or Path(os.environ.get(LOCK_DIR_VAR, DEFAULT_LOCK_DIR))
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)  # made here: shared by every user's runs, like /tmp (a given folder keeps its mode)
    return folder


def lock_path(device: str, folder: Path | None = None) -> Path:
    """The lock file of ``device`` (a UUID such as ``GPU-5f3c...``, or an index)."""
    # Old-style MIG UUIDs hold slashes (MIG-GPU-<uuid>/<gi>/<ci>).
    return lock_dir(folder) / f"gpu-{re.sub(r'[^A-Za-z0-9._-]', '_', device)}.lock"


def _holder_path(device: str, folder: Path | None) -> Path:
    return lock_path(device, folder).with_suffix(".holder.json")


def holder(device: str, folder: Path | None = None) -> str:
    """Who holds ``device``, as the holder described itself ("unknown" if it did not)."""
    try:
        info = json.loads(_holder_path(device, folder).read_text())
        return f"pid {info['pid']} on {info['host']} ({info['what']}, since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


@contextlib.contextmanager
def hold(
    devices: Sequence[str],
    what: str,
    wait_s: float,
    say: Callable[[str], None] = lambda m: None,
    folder: Path | None = None,
) -> Iterator[None]:
    """Hold every GPU in ``devices`` (in sorted order, so two runs never deadlock)."""
    with contextlib.ExitStack() as stack:
        deadline = time.monotonic() + wait_s
        for device in sorted(devices):
            stack.enter_context(_hold_one(device, what, deadline, wait_s, say, folder))
        yield


@contextlib.contextmanager
def _hold_one(
    device: str, what: str, deadline: float, wait_s: float, say: Callable[[str], None], folder: Path | None
) -> Iterator[None]:
    lock = FileLock(str(lock_path(device, folder)))
    while True:
        try:
            lock.acquire(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            break
        except Timeout:
            if time.monotonic() >= deadline:
                raise DeviceBusy(
                    f"GPU {device} is held by another perfsuite run: {holder(device, folder)}; gave up after "
                    f"{wait_s:g} s. Let that run finish, or wait longer with --perf-device-wait"
                ) from None
            say(f"perfsuite: waiting for GPU {device}, held by {holder(device, folder)}")
    try:
        info = {"pid": os.getpid(), "host": platform.node(), "what": what, "since": _now(), "argv": sys.argv}
        _holder_path(device, folder).write_text(json.dumps(info))
        yield
    finally:
        with contextlib.suppress(OSError):
            _holder_path(device, folder).unlink()
        lock.release()


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()
