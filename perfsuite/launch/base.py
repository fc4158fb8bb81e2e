"""Launcher interface and the classification of a finished launch.

A launcher only starts processes and waits; what the workers measured comes back
as one JSON report per rank in the job's folder. Classification looks at those
reports first and at each rank's stderr second, because a rank killed by the
allocator (``std::bad_alloc``, SIGKILL) never writes its report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from perfsuite.core.protocol import LAUNCH_MARKS, LaunchMark, ProtocolError, RankJob, RankReport, RankStart

Status = Literal["ok", "oom", "timeout", "crash", "skipped"]

# Messages of a real allocation failure, on CUDA and on CPU (RLIMIT_DATA makes
# torch's CPU allocator and glibc fail this way).
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|"
    r"DefaultCPUAllocator: can't allocate memory|MemoryError|std::bad_alloc|"
    r"Cannot allocate memory"
)
TAIL_LINES = 25


@dataclass(frozen=True)
class WorkerJob:
    """Everything a launcher needs to run one scenario once."""

    rank_job: RankJob  # written to job.json and read by perfsuite.rank.worker
    world_size: int
    timeout_s: float
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    nproc_per_node: int | None = None  # ranks per node (default: all on one node)
    devices: tuple[str, ...] = ()  # this host's visible GPUs (index or UUID), split among emulated nodes
    python: str = sys.executable  # interpreter of the agents and ranks (a named environment's)
    rank_start: RankStart = "exec"

    def node_of(self, rank: int) -> tuple[int, int]:
        """(node, local rank) of a global rank."""
        per_node = self.nproc_per_node or self.world_size
        return rank // per_node, rank % per_node

    @property
    def spec_path(self) -> Path:
        return self.workdir / "job.json"

    @property
    def reports_dir(self) -> Path:
        return self.workdir / "reports"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"


@dataclass(frozen=True)
class RankFailure:
    rank: int
    message: str
    stderr_tail: str
    phase: str = ""

    def describe(self) -> str:
        where = f" during {self.phase}" if self.phase else ""
        return f"rank {self.rank}{where}: {self.message}\n--- rank {self.rank} stderr (tail) ---\n{self.stderr_tail}"


@dataclass(frozen=True)
class LaunchOutcome:
    status: Status
    reports: Sequence[RankReport]  # successful per-rank reports, rank order
    failure: RankFailure | None = None
    skip_reason: str = ""
    wall_s: float = 0.0
    failed_reports: Sequence[RankReport] = ()
    """Reports of the ranks that failed and said how (an OOM's allocations, when recorded), rank order."""
    marks: Mapping[str, float] = field(default_factory=dict)
    """The gate's marks of the launch's timeline (``spawn``, ``exit``: ``time.time()``)."""
    started: RankStart | None = None
    """How the launch's processes started, when the launcher knows (a ``warm`` launch whose
    parent could not serve it starts ``fork``)."""
    start_note: str = ""
    """Why the processes did not start as the job asked ("" when they did)."""
    warm: Mapping[str, Any] = field(default_factory=dict)
    """A warm launch's parent (:meth:`perfsuite.launch.warm.ParentFacts.as_json`)."""

    def timeline(self) -> list[tuple[LaunchMark, float]]:
        """Every mark the launch passed, in :data:`~perfsuite.core.protocol.LAUNCH_MARKS` order, as
        seconds since the gate's spawn: the gate's, rank 0's and its agent's, and ``end`` at the
        wall time. Each is at least the one before (a process's start is read in 10 ms ticks).
        Empty for a launcher that does not mark its spawn."""
        spawn = self.marks.get("spawn")
        if spawn is None:
            return []
        rank0 = next((r.marks for r in (*self.reports, *self.failed_reports) if r.rank == 0), {})
        known = {**rank0, **self.marks, "end": spawn + self.wall_s}
        found: list[tuple[LaunchMark, float]] = []
        at = 0.0
        for name in LAUNCH_MARKS:
            if name in known:
                at = max(at, known[name] - spawn)
                found.append((name, round(at, 3)))
        return found

    @property
    def overhead_s(self) -> float | None:
        """Wall time less rank 0's timed warmup and measured steps: what the launch cost besides
        measuring (None without rank 0's report)."""
        rank0 = next((r for r in self.reports if r.rank == 0), None)
        if rank0 is None:
            return None
        return round(self.wall_s - sum(rank0.warmup_times_s) - sum(rank0.step_times_s), 3)


class Launcher(ABC):
    """Starts ``job.world_size`` workers running :mod:`perfsuite.rank.worker` (forked from their agent or not)."""

    name: str

    @abstractmethod
    def run(self, job: WorkerJob) -> LaunchOutcome:
        """Run the job to completion or timeout; leave no process behind."""


def read_reports(job: WorkerJob) -> dict[int, RankReport]:
    """Reports the ranks wrote; one that does not decode fails loudly, naming
    the field, since it means the two sides of the protocol disagree."""
    reports: dict[int, RankReport] = {}
    for path in sorted(job.reports_dir.glob("rank*.json")):
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a rank killed mid-write: treated as missing
        try:
            report = RankReport.from_json(raw)
        except ProtocolError as exc:
            raise ProtocolError(f"{path}: {exc}") from None
        reports[report.rank] = report
    return reports


def read_phase(job: WorkerJob, rank: int) -> str:
    path = job.reports_dir / f"rank{rank}.phase"
    return path.read_text().strip() if path.exists() else "startup"


def _stderr_files(job: WorkerJob, rank: int) -> list[Path]:
    node, local = job.node_of(rank)
    return sorted((job.logs_dir / f"node{node}").glob(f"*/attempt_*/{local}/stderr.log"))


def stderr_tail(job: WorkerJob, rank: int) -> str:
    """Last lines of a rank's stderr as its node's torchrun agent redirected it."""
    files = _stderr_files(job, rank)
    if not files:
        return "(no stderr captured)"
    lines = files[-1].read_text(errors="replace").splitlines()
    return "\n".join(lines[-TAIL_LINES:]) or "(stderr empty)"


def classify(job: WorkerJob, timed_out: bool, wall_s: float, marks: Mapping[str, float] | None = None) -> LaunchOutcome:
    """Decide ok / oom / timeout / crash / skipped from reports and stderr; ``marks``: the gate's
    marks of the launch's timeline, kept in the outcome."""
    return dataclasses.replace(_classified(job, timed_out, wall_s), marks=dict(marks or {}))


def _classified(job: WorkerJob, timed_out: bool, wall_s: float) -> LaunchOutcome:
    reports = read_reports(job)
    ranks = range(job.world_size)
    skipped = [r for r in reports.values() if r.status == "skipped"]
    if skipped:
        return LaunchOutcome("skipped", [], skip_reason=skipped[0].error, wall_s=wall_s)
    if not timed_out and all(r in reports and reports[r].status == "ok" for r in ranks):
        return LaunchOutcome("ok", [reports[r] for r in ranks], wall_s=wall_s)
    if timed_out:
        rank = hung_rank(job, [r for r in ranks if r not in reports] or list(ranks))
        phases = ", ".join(f"rank {r}: {read_phase(job, r)}" for r in ranks)
        message = f"no result within {job.timeout_s:.0f}s (last phases: {phases})"
        failure = RankFailure(rank, message, hang_tail(job, rank), read_phase(job, rank))
        return LaunchOutcome("timeout", [], failure, wall_s=wall_s)
    return _classify_failure(job, reports, wall_s)


def _classify_failure(job: WorkerJob, reports: Mapping[int, RankReport], wall_s: float) -> LaunchOutcome:
    failed = [r for r in range(job.world_size) if r not in reports or reports[r].status != "ok"]
    tails = {r: stderr_tail(job, r) for r in failed}
    oom_ranks = [r for r in failed if (r in reports and reports[r].status == "oom") or OOM_PATTERNS.search(tails[r])]
    # The rank that ended first without a report (a signal, or a library's exit()) is the cause:
    # the agent stops the others after it.
    first = {r: code for r, code in root_causes(job).items() if r in failed and r not in reports}
    # Prefer a rank that reported its own error over one torchrun killed afterwards.
    reported = [r for r in failed if r in reports]
    rank = (oom_ranks or list(first) or reported or failed)[0]
    message = (reports[rank].error if rank in reports else "") or _no_report(first.get(rank))
    failure = RankFailure(rank, message, tails[rank], read_phase(job, rank))
    said = [reports[r] for r in sorted(reports) if reports[r].status in ("oom", "crash")]
    return LaunchOutcome("oom" if oom_ranks else "crash", [], failure, wall_s=wall_s, failed_reports=said)


# torchrun's failure summary: "Root Cause (first observed failure):" then a block
# with "rank      : 1 (local_rank: 1)" and "exitcode  : -9 (pid: 123)".
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\s*\n(?:.*\n){0,3}?\s*rank\s*:\s*(?P<rank>\d+).*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d+)"
)


def root_causes(job: WorkerJob) -> dict[int, int]:
    """Ranks the agents' failure summaries name as the first failure, with their exit codes
    (negative: the signal that ended it), from the agent logs in the job folder."""
    found: dict[int, int] = {}
    for log in sorted(job.workdir.glob("agent*.log")):
        for match in _ROOT_CAUSE.finditer(log.read_text(errors="replace")):
            found[int(match["rank"])] = int(match["code"])
    return found


def _no_report(code: int | None) -> str:
    if code is None:
        return "worker exited without a report"
    if code >= 0:
        # perfsuite's worker always reports before it exits, so something in the process ended it.
        return f"exited with code {code} before it could report (an exit() in the model, its step or a library)"
    signum = -code
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = (
        "; SIGKILL is usually the host's OOM killer (see `dmesg` or the job's memory limit), or someone's kill -9"
        if signum == signal.SIGKILL
        else ""
    )
    return f"killed by {name} (signal {signum}) before it could report{why}"


_PHASES = ("startup", "init", "build", "wrap", "warmup", "measure", "report", "done")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line \d+ in (?P<func>\S+)')
#: A frame of perfsuite's rank worker (before the folders, ``perfsuite/worker/``: recorded dumps keep that).
_WORKER = re.compile(r"perfsuite/(rank/)?worker/")


#: faulthandler's header of each thread's block, and the line its dump on timeout starts with.
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$", flags=re.M)
_TIMEOUT = re.compile(r"^Timeout \(\d+:\d+:\d+\)!$")
#: Lines a hung rank printed before its dump that its tail keeps.
PRINTED_LINES = 5


def main_thread_stack(stderr: str) -> list[str] | None:
    """Frame lines of the last stack dump's main-thread block, innermost first.

    faulthandler prints each thread as a block of frames, innermost first; the
    main thread is the block that runs perfsuite's worker loop.
    """
    blocks = _THREAD.split(stderr)
    for block in reversed(blocks[1:]):
        frames = [line for line in block.splitlines() if _FRAME.match(line)]
        if any(_WORKER.search(line) for line in frames):
            return frames
    return None


def innermost_frame(stderr: str) -> str | None:
    """File of the innermost frame of the last stack dump's main thread."""
    frames = main_thread_stack(stderr)
    match = _FRAME.match(frames[0]) if frames else None
    return match.group("file") if match else None


def hang_tail(job: WorkerJob, rank: int) -> str:
    """What a hung rank was doing: the innermost frames of its main thread, as
    dumped on timeout (a forked rank's stack also holds its agent's frames,
    outermost, which a plain tail would show instead); else its stderr tail."""
    stderr = _full_stderr(job, rank)
    frames = main_thread_stack(stderr)
    if not frames:
        return stderr_tail(job, rank)
    # What it printed last before the dump often says what it was waiting for.
    before = [x for x in _THREAD.split(stderr, maxsplit=1)[0].splitlines() if x.strip() and not _TIMEOUT.match(x)]
    printed = ["last lines it printed:", *before[-PRINTED_LINES:]] if before else []
    return "\n".join([*printed, "main thread, most recent call first:", *frames[:TAIL_LINES]])


def hung_rank(job: WorkerJob, candidates: Sequence[int]) -> int:
    """Which rank hung: one stuck outside torch (the rest wait in collectives),
    else the one that got least far."""
    for rank in candidates:
        frame = innermost_frame(_full_stderr(job, rank))
        if frame is not None and f"{os.sep}torch{os.sep}" not in frame:
            return rank
    return min(candidates, key=lambda r: _phase_order(read_phase(job, r)))


def _full_stderr(job: WorkerJob, rank: int) -> str:
    files = _stderr_files(job, rank)
    return files[-1].read_text(errors="replace") if files else ""


def _phase_order(phase: str) -> int:
    head = phase.split(" ", 1)[0]
    return _PHASES.index(head) if head in _PHASES else 0
