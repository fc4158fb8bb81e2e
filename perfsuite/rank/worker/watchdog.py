"""Ranks end themselves when whoever launched them is gone.

A torchrun agent stops its ranks when it is told to, but nothing tells it when
the pytest process that started it dies by SIGKILL (a cancelled CI job after
its grace period, an OOM-killed runner), and an agent killed the same way
leaves its ranks running with nobody to stop them, holding GPUs for the next
job. So every rank watches two processes from a daemon thread: its parent (the
agent) and, when on the same host, the pytest process named in
``PERFSUITE_LAUNCHER`` (``host:pid:create_time``, the create time guarding
against a reused pid). When either is gone the rank exits; its agent then sees
a failed worker and exits too (``--max-restarts 0``).
"""

from __future__ import annotations

import os
import platform
import sys
import threading

import psutil

from perfsuite.core.protocol import LAUNCHER_VAR

POLL_S = 1.0
EXIT_CODE = 75  # EX_TEMPFAIL: the run was abandoned, not failed


def _alive(pid: int, create_time: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.01
    except psutil.NoSuchProcess:
        return False


def _launcher(token: str) -> tuple[int, float] | None:
    """(pid, create time) of the launcher if it runs on this host."""
    host, _, rest = token.partition(":")
    pid, _, created = rest.partition(":")
    if host != platform.node() or not pid.isdigit():
        return None
    return int(pid), float(created or 0)


def gone(parent: int, launcher: tuple[int, float] | None) -> str:
    """What is gone ("" while both live)."""
    if os.getppid() != parent:
        return f"its torchrun agent (pid {parent}) is gone"
    if launcher is not None and not _alive(*launcher):
        return f"the pytest process that launched it (pid {launcher[0]}) is gone"
    return ""


def watch(parent: int, launcher: tuple[int, float] | None, stop: threading.Event) -> None:
    while not stop.wait(POLL_S):
        what = gone(parent, launcher)
        if what:
            print(f"perfsuite rank: {what}; exiting so nothing outlives the run", file=sys.stderr, flush=True)
            os._exit(EXIT_CODE)  # from a thread: the main thread may be blocked in a collective


def start(environ: dict[str, str] | None = None) -> threading.Event:
    """Start watching; set the returned event to stop (at a clean exit)."""
    environ = dict(os.environ) if environ is None else environ
    token = environ.get(LAUNCHER_VAR, "")
    stop = threading.Event()
    thread = threading.Thread(
        target=watch,
        args=(os.getppid(), _launcher(token) if token else None, stop),
        daemon=True,
        name="perfsuite-watchdog",
    )
    thread.start()
    return stop
