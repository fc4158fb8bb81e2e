"""When a launched process reached each mark of its launch's timeline
(:data:`~perfsuite.core.protocol.LaunchMark`). Torch-free: the agent reads it
before it imports torch.

A process's own start is read from the kernel (``/proc/self/stat``), not from
its first line: for a rank exec'd anew that includes the interpreter's start,
for one forked from its agent it is the fork. The kernel counts it in clock
ticks (10 ms on Linux), so it may read up to a tick before an event that came
first (the gate's spawn).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from perfsuite.core.protocol import AGENT_MARKS_VAR, LaunchMark

Marks = dict[str, float]


def process_start() -> float:
    """This process's start as ``time.time()`` would have read it (now, off Linux)."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the command's name, which may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: ticks after boot
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, IndexError, ValueError, AttributeError):
        return time.time()


def hand_to_ranks(marks: Marks) -> None:
    """Put an agent's ``marks`` into its environment, which the ranks it starts inherit."""
    os.environ[AGENT_MARKS_VAR] = json.dumps(marks)


def rank_started() -> Marks:
    """A rank's first marks: its agent's (from the environment) and its own start."""
    marks: Marks = {}
    try:
        given: Any = json.loads(os.environ.get(AGENT_MARKS_VAR, "{}"))
    except ValueError:
        given = {}
    if isinstance(given, dict):
        marks.update({k: float(v) for k, v in given.items() if isinstance(v, (int, float))})
    marks["rank_start"] = process_start()
    return marks


def mark(marks: Marks, name: LaunchMark) -> None:
    """Record ``name`` now, unless it is already recorded (the first time counts)."""
    marks.setdefault(name, time.time())
