"""Stopping what a command started (``perfsuite.launch.procs``): SIGTERM turned into Ctrl-C, signals
held through a cleanup and deferred through a child's start, and a child's whole process group
stopped, with SIGKILL for one that ignores SIGTERM and its pipes drained meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from perfsuite.launch import procs


@pytest.fixture
def default_sigterm() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("default_sigterm")
def test_sigterm_becomes_a_keyboard_interrupt_until_restored_and_a_handler_of_others_stays() -> None:
    restore = procs.interrupt_on_sigterm("perfsuite: ")
    with pytest.raises(KeyboardInterrupt, match=r"^perfsuite: SIGTERM received, stopping$"):
        signal.raise_signal(signal.SIGTERM)
    restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def theirs(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, theirs)
    procs.interrupt_on_sigterm()()  # someone else's handler: neither replaced nor "restored" away
    assert signal.getsignal(signal.SIGTERM) is theirs


@pytest.mark.usefixtures("default_sigterm")
def test_held_signals_are_ignored_and_deferred_ones_arrive_after_the_block() -> None:
    procs.interrupt_on_sigterm()
    before = {s: signal.getsignal(s) for s in procs.STOPPING}
    with procs.signals_held():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
    assert {s: signal.getsignal(s) for s in procs.STOPPING} == before
    reached = []
    with pytest.raises(KeyboardInterrupt, match="SIGTERM received"), procs.signals_deferred():
        signal.raise_signal(signal.SIGTERM)
        reached.append("the rest of the block")
    assert reached == ["the rest of the block"]
    assert {s: signal.getsignal(s) for s in procs.STOPPING} == before


def test_a_deferred_signal_that_was_ignored_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's SIGINT
    try:
        with procs.signals_deferred():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


# A child that starts a grandchild in its group, then waits; with IGNORE it ignores SIGTERM, with
# FLOOD it answers SIGTERM by writing more than a pipe holds before it exits.
CHILD = """
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
mode = sys.argv[1]
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "flood":
    def flood(signum, frame):
        sys.stdout.write("x" * 300_000)
        sys.stdout.flush()
        sys.exit(0)
    signal.signal(signal.SIGTERM, flood)
print("ready", flush=True)
time.sleep(60)
"""


def started(mode: str) -> subprocess.Popen[str]:
    with procs.stoppable([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def group(pgid: int) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return alive


def gone(pgid: int, within_s: float = 5.0) -> bool:
    """Whether the group empties: a member that got SIGKILL may show as running for a moment."""
    deadline = time.monotonic() + within_s
    while group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group(pgid)


def test_a_child_that_ignores_sigterm_is_killed_with_its_group_after_the_grace() -> None:
    proc = started("ignore")
    assert len(group(proc.pid)) == 2  # the child and its grandchild, in the child's own group
    began = time.monotonic()
    procs.stop_group(proc, grace_s=1.0)
    assert 1.0 <= time.monotonic() - began < 5.0
    assert proc.returncode == -signal.SIGKILL
    assert gone(proc.pid)


def test_a_child_that_floods_its_pipe_on_sigterm_is_drained_and_exits_by_itself() -> None:
    proc = started("flood")
    procs.stop_group(proc, grace_s=10.0)
    assert proc.returncode == 0  # it finished writing: nobody had to SIGKILL it
    assert gone(proc.pid)


def test_an_interrupt_in_the_block_stops_the_childs_group() -> None:
    argv = [sys.executable, "-c", CHILD, "plain"]
    with pytest.raises(KeyboardInterrupt), procs.stoppable(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        raise KeyboardInterrupt
    assert proc.returncode is not None and gone(proc.pid)


def test_output_that_is_not_utf8_is_replaced_not_a_traceback() -> None:
    done = procs.run_stoppable([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'a\\xffb')"])
    assert done.returncode == 0 and done.stdout == "a\ufffdb"
