"""The session's settings: what the command line chose for this run.

The plugin builds one :class:`RunSettings` from its validated options
(:mod:`perfsuite.plugin.options`) and hands it to the session; launching, judging and
recording read it from there, so it lives below all of them. Pytest side,
torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from perfsuite.core.profiles import HardwareProfile
from perfsuite.launch.envs import PythonEnv, parse_envs

#: When to profile ops (perfsuite.gate.profiling): ``--perf-op-profiles`` offers these.
OpProfileMode = Literal["auto", "always", "off"]
OP_PROFILE_MODES: tuple[OpProfileMode, ...] = get_args(OpProfileMode)
#: Whether to count and judge each step's work (perfsuite.gate.work): ``--perf-work`` offers these.
WorkMode = Literal["on", "off"]
WORK_MODES: tuple[WorkMode, ...] = get_args(WorkMode)


@dataclass(frozen=True)
class RunSettings:
    """Session-wide choices from the command line."""

    profile: HardwareProfile
    baselines_dir: Path
    update_baselines: bool = False
    timeout_s: float | None = None
    workdir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    repeats: int = 1  # fresh launches pooled into one measurement
    confirm: int = 1  # extra measurements an apparent regression must survive
    slowdown_pct: float = 0.0  # planted extra work per step (gate self-test)
    calibrate: bool = False  # write recommended tolerances into the baselines
    accept_oom: frozenset[str] = frozenset()  # scenario ids whose OOM may be recorded as expected
    envs: Mapping[str, PythonEnv] = field(default_factory=lambda: parse_envs([]))  # named interpreters
    device_wait_s: float = 600.0  # how long a launch waits for GPUs another run holds
    lock_dir: Path | None = None  # the GPU locks' folder (None: PERFSUITE_LOCK_DIR or /tmp/perfsuite-locks)
    contention_retries: int = 2  # fresh measurements after a contended one, each after the host went quiet
    contention_wait_s: float = 60.0  # longest wait for a quiet host, per scenario
    contention_budget_s: float = 300.0  # longest waiting in all, per session
    op_profiles: OpProfileMode = "off"  # when to profile ops (perfsuite.gate.profiling; the plugin: auto)
    count_work: bool = False  # count the gate's launches' step work and judge it (perfsuite.gate.work; plugin: on)
    artifacts_dir: Path = Path("perf-artifacts")  # where traces and allocator snapshots are kept
    selected: tuple[str, ...] = ()  # the scenario ids the run selected: its family of timing-judged rows
