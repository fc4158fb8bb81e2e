"""Op-level profiles: what a scenario's steps spend their time on, compact enough to
keep beside its baseline, and the diff that says why a scenario got slower.

A rank profiles a few steady-state steps with ``torch.profiler`` after its
measured steps (:mod:`perfsuite.rank.worker.profiling`) and reports an
:class:`OpProfile`: per op, calls, self CPU time, self device time and bytes
allocated, each per step, for the ops that take the most time plus one
``[other]`` row. Work inside a ``perfsuite::`` region (the planted slowdown)
counts under the region's name, not under the ops it ran. The pytest side
merges the ranks (:func:`merge`), stores the result beside the baseline and,
on a regression, diffs a fresh profile against it (:func:`diff`).

Which time ranks an op: self CPU time on a cpu profile, self device (kernel)
time on CUDA, where the host only launches the work. Torch-free: both sides
import it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

VERSION = 1
OTHER = "[other]"
#: Ops kept per profile, by time; the rest are summed into ``[other]``.
TOP_OPS = 40
#: The regions perfsuite itself adds; work inside one is counted under its name.
REGION_PREFIX = "perfsuite::"
PLANTED_REGION = "perfsuite::planted_slowdown"
#: Profiled steps per launch: a few steady-state steps after the measured ones (and one before
#: them under the profiler, discarded: the profiler's start-up lands in it). Reading the profiler's
#: events back costs a rank about 0.2 s per profiled step of a small GPT on one cpu core.
STEPS = 3
#: An op's change is listed only when the part of it that a uniform slowdown does not explain
#: exceeds this share of the baseline's step time, so that an unchanged rerun lists nothing, on a
#: quiet or a uniformly slower machine (tests/test_opprofile.py checks it on real profiles).
NOISE_SHARE = 0.10
#: Lines the failure message leads with.
LEAD = 3
#: Size cap of a stored summary per scenario (JSON bytes).
MAX_SUMMARY_BYTES = 20_000


@dataclass(frozen=True)
class OpStat:
    """One op (or perfsuite region), per profiled step."""

    name: str
    calls: float
    cpu_us: float
    """Self CPU time."""
    device_us: float = 0.0
    """Self device time (CUDA kernels the op launched); 0 on cpu."""
    alloc_bytes: float = 0.0
    """Bytes the op allocated and did not free itself (the profiler's memory records)."""

    def time_us(self, device: str) -> float:
        return self.device_us if device == "cuda" else self.cpu_us


@dataclass(frozen=True)
class OpProfile:
    """A launch's profiled steps: its top ops per step, on one rank or merged over ranks."""

    device: str
    steps: int
    step_s: float
    """Mean wall time of a profiled step (profiler on)."""
    unprofiled_step_s: float
    """Median measured step time of the same launch (profiler off): the reference for the overhead."""
    ops: tuple[OpStat, ...]
    ranks: int = 1
    rank_time_us: tuple[float, ...] = ()
    """Per rank, the profiled time per step of all its ops (merged profiles)."""
    processing_s: float = 0.0
    """Wall time the rank spent after the profiled steps: reading the profiler's events, summarising
    them and writing the trace (merged: the slowest rank's)."""
    trace: str = ""
    """The gzipped Chrome trace of these steps (a rank's: its file name in the reports folder;
    merged: where the session kept it); "" when none was kept (over the size cap)."""
    version: int = VERSION

    @property
    def overhead(self) -> float:
        """How much slower a profiled step ran than a measured one (0.12: 12%)."""
        return self.step_s / self.unprofiled_step_s - 1 if self.unprofiled_step_s > 0 else 0.0

    @property
    def time_us(self) -> float:
        """Profiled time per step over all ops (the time that ranks them)."""
        return sum(op.time_us(self.device) for op in self.ops)

    def op(self, name: str) -> OpStat | None:
        return next((op for op in self.ops if op.name == name), None)

    def step_us(self, op: OpStat) -> float:
        """The op's share of the profiled time, times the launch's unprofiled step time: what it costs a
        measured step. The profiler's overhead and a machine that is busier for a moment both scale
        every op alike, so shares move far less between launches than the ops' own times."""
        total = self.time_us
        return op.time_us(self.device) / total * self.unprofiled_step_s * 1e6 if total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """As the rank report and the stored file hold it (read back with ``protocol.decode(OpProfile, ...)``)."""
        return dataclasses.asdict(self)


def top(stats: Iterable[OpStat], device: str, keep: int = TOP_OPS) -> tuple[OpStat, ...]:
    """The ``keep`` ops that take the most time, then one ``[other]`` row summing the rest."""
    ranked = sorted(stats, key=lambda op: op.time_us(device), reverse=True)
    kept, rest = ranked[:keep], ranked[keep:]
    if not rest:
        return tuple(kept)
    other = OpStat(
        OTHER,
        sum(op.calls for op in rest),
        sum(op.cpu_us for op in rest),
        sum(op.device_us for op in rest),
        sum(op.alloc_bytes for op in rest),
    )
    return (*kept, other)


def merge(profiles: Sequence[OpProfile]) -> OpProfile:
    """The ranks' profiles as one: each op's mean over the ranks (an op a rank did not run counts 0)."""
    first = profiles[0]
    names = list(dict.fromkeys(op.name for p in profiles for op in p.ops))
    n = len(profiles)

    def mean_of(name: str) -> OpStat:
        found = [p.op(name) for p in profiles]
        present = [op for op in found if op is not None]
        return OpStat(
            name,
            sum(op.calls for op in present) / n,
            sum(op.cpu_us for op in present) / n,
            sum(op.device_us for op in present) / n,
            sum(op.alloc_bytes for op in present) / n,
        )

    return OpProfile(
        first.device,
        first.steps,
        statistics.fmean(p.step_s for p in profiles),
        statistics.fmean(p.unprofiled_step_s for p in profiles),
        top((mean_of(name) for name in names if name != OTHER), first.device) + _others(profiles, n),
        ranks=n,
        rank_time_us=tuple(p.time_us for p in profiles),
        processing_s=max(p.processing_s for p in profiles),
        trace=first.trace,
    )


def _others(profiles: Sequence[OpProfile], n: int) -> tuple[OpStat, ...]:
    rows = [op for p in profiles for op in p.ops if op.name == OTHER]
    if not rows:
        return ()
    return (
        OpStat(
            OTHER, *(sum(getattr(op, f) for op in rows) / n for f in ("calls", "cpu_us", "device_us", "alloc_bytes"))
        ),
    )


# -- the diff -------------------------------------------------------------------------
@dataclass(frozen=True)
class OpChange:
    """One op's time and allocations per step, then and now."""

    name: str
    base_us: float | None
    """None: the op did not run in the baseline's profile (a new op)."""
    current_us: float | None
    """None: it no longer runs."""
    base_bytes: float = 0.0
    current_bytes: float = 0.0
    own_us: float = 0.0
    """The change a uniform slowdown does not explain: now, less the baseline's time scaled by how
    much the whole step slowed. A machine that runs every op 2x slower moves no op's own time; a
    widened matmul moves the matmul's. Equal to the op's change of share times the current step."""

    @property
    def delta_us(self) -> float:
        return (self.current_us or 0.0) - (self.base_us or 0.0)

    @property
    def delta_bytes(self) -> float:
        return self.current_bytes - self.base_bytes

    def describe(self) -> str:
        ms = f"{self.delta_us / 1000:+.3g} ms/step"
        if self.base_us is None:
            return f"new op {self.name} {ms}"
        if self.current_us is None:
            return f"{self.name} gone ({ms})"
        rel = f" ({self.delta_us / self.base_us:+.0%})" if self.base_us > 0 else ""
        return f"{self.name} {ms}{rel}"


@dataclass(frozen=True)
class ProfileDiff:
    """A current profile against the stored one: which ops explain the change per step."""

    base: OpProfile
    current: OpProfile
    changes: tuple[OpChange, ...]
    """Every op of either, largest increase first."""

    @property
    def slowdown_us(self) -> float:
        """How much longer a step took, between the two profiles' unprofiled (measured) steps."""
        return (self.current.unprofiled_step_s - self.base.unprofiled_step_s) * 1e6

    @property
    def noise_us(self) -> float:
        return NOISE_SHARE * self.base.unprofiled_step_s * 1e6

    def significant(self) -> list[OpChange]:
        """The changes whose own part (what a uniform slowdown does not explain) is beyond the noise
        threshold, largest increase first (an op that explains more of the added time leads)."""
        return [c for c in self.changes if abs(c.own_us) > self.noise_us]

    def grown(self) -> list[OpChange]:
        """The ops the diff blames: their own part grew beyond the noise threshold."""
        return [c for c in self.significant() if c.own_us > 0]

    def lead(self) -> str:
        """The failure message's first line: the ops that explain most of the added time."""
        grown = self.grown()[:LEAD]
        if not grown:
            alike = (
                f"; every op slowed alike, the step {self.slowdown_us / 1000:+.3g} ms" if self.slowdown_us > 0 else ""
            )
            return (
                f"op profile: no op's share of the step grew by more than {NOISE_SHARE:.0%} of the baseline's "
                f"step time ({self.noise_us / 1000:.3g} ms){alike}"
            )
        explained = sum(c.delta_us for c in grown)
        share = (
            f", {explained / self.slowdown_us:.0%} of the {self.slowdown_us / 1000:.3g} ms/step added"
            if (self.slowdown_us > 0)
            else ""
        )
        return "op profile: " + ", ".join(c.describe() for c in grown) + share

    def grown_allocations(self) -> list[OpChange]:
        """Ops that allocate more per step than in the baseline's profile, most first."""
        return sorted((c for c in self.changes if c.delta_bytes > 0), key=lambda c: c.delta_bytes, reverse=True)

    def table(self, limit: int = 10) -> list[tuple[str, ...]]:
        """Rows for a report: op, then and now (ms/step), change, allocations' change (MiB/step)."""
        rows: list[tuple[str, ...]] = []
        for c in self.changes[:limit]:
            then = "-" if c.base_us is None else f"{c.base_us / 1000:.3g}"
            now = "-" if c.current_us is None else f"{c.current_us / 1000:.3g}"
            rows.append((c.name, then, now, f"{c.delta_us / 1000:+.3g}", f"{c.delta_bytes / 2**20:+.3g}"))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "lead": self.lead(),
            "noise_us": self.noise_us,
            "slowdown_us": self.slowdown_us,
            "changes": [{**dataclasses.asdict(c), "delta_us": c.delta_us} for c in self.changes[:TOP_OPS]],
            "grown": [c.name for c in self.grown()],
        }


TABLE_COLUMNS = ("op", "baseline ms/step", "now ms/step", "change ms", "alloc change MiB")


def diff(base: OpProfile, current: OpProfile) -> ProfileDiff:
    """Every op of either profile, then and now, largest increase in time first."""
    names = list(dict.fromkeys([*(op.name for op in base.ops), *(op.name for op in current.ops)]))
    slowed = current.unprofiled_step_s / base.unprofiled_step_s if base.unprofiled_step_s > 0 else 1.0
    changes = []
    for name in names:
        then, now = base.op(name), current.op(name)
        then_us = base.step_us(then) if then else None
        now_us = current.step_us(now) if now else None
        changes.append(
            OpChange(
                name,
                then_us,
                now_us,
                then.alloc_bytes if then else 0.0,
                now.alloc_bytes if now else 0.0,
                own_us=(now_us or 0.0) - (then_us or 0.0) * slowed,
            )
        )
    changes.sort(key=lambda c: c.delta_us, reverse=True)
    return ProfileDiff(base, current, tuple(changes))


def top_lines(profile: OpProfile, limit: int = 5) -> str:
    """The current run's top ops, for a regression without a stored profile to diff against."""
    ranked = sorted(profile.ops, key=lambda op: op.time_us(profile.device), reverse=True)[:limit]
    return ", ".join(f"{op.name} {profile.step_us(op) / 1000:.3g} ms/step" for op in ranked)
