"""Why a scenario regressed: its fresh op profile against the one stored with its baseline.

The session attaches an :class:`Explanation` to a regressed result (and the
results file keeps it), the failure message leads with :meth:`Explanation.lead`,
and ``python -m perfsuite explain RESULTS.json`` (:mod:`perfsuite.commands.explain`)
prints the same from the file later. Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.core.opprofile import OpProfile, ProfileDiff, diff, top_lines
from perfsuite.core.protocol import decode


@dataclass(frozen=True)
class Explanation:
    """A regressed scenario's op profile now, and the baseline's when one was stored."""

    current: OpProfile
    baseline: OpProfile | None
    stored_in: str
    """The op profile file the baseline's profile was read from (or would be)."""
    trace: str = ""
    """The kept Chrome trace of the profiled launch ("" when none was kept)."""
    note: str = ""
    """Why something is missing (a trace over the size cap)."""
    elsewhere: int = 0
    """How many other processors have a profile stored (cpu keeps one per processor): none of
    theirs is compared, since another processor runs other kernels."""

    def diff(self) -> ProfileDiff | None:
        return diff(self.baseline, self.current) if self.baseline is not None else None

    def lead(self, memory: bool = False) -> str:
        """The failure message's first line; ``memory``: the regression was in peak memory."""
        found = self.diff()
        if found is None and self.elsewhere:
            return (
                f"op profile: none stored for this processor in {self.stored_in} ({self.elsewhere} other "
                "processor(s) have one; their kernels differ, so it is not compared); store one here by "
                f"re-recording: --perf-update-baselines. Top ops now: {top_lines(self.current)}"
            )
        if found is None:
            return (
                f"op profile: no profile stored with this baseline ({self.stored_in}); store one by re-recording: "
                f"--perf-update-baselines. Top ops now: {top_lines(self.current)}"
            )
        if not memory:
            return found.lead()
        grown = found.grown_allocations()[:3]
        if not grown:
            return "op profile: no op allocates more per step than in the baseline's profile"
        shown = ", ".join(f"{c.name} {c.delta_bytes / 2**20:+.3g} MiB/step" for c in grown)
        return f"op profile: allocations grew in {shown}"

    def footer(self) -> str:
        """The profiler's overhead and where the trace is."""
        where = f"trace: {self.trace}" if self.trace else (self.note or "no trace kept")
        return f"profiler overhead {self.current.overhead:+.0%} per step; {where}"

    def to_json(self) -> dict[str, Any]:
        found = self.diff()
        return {
            "current": self.current.to_json(),
            "baseline": self.baseline.to_json() if self.baseline else None,
            "stored_in": self.stored_in,
            "trace": self.trace,
            "note": self.note,
            "elsewhere": self.elsewhere,
            "diff": found.to_json() if found else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Explanation:
        base = data.get("baseline")
        return cls(
            decode(OpProfile, data["current"]),
            decode(OpProfile, base) if base else None,
            str(data.get("stored_in", "")),
            str(data.get("trace", "")),
            str(data.get("note", "")),
            int(data.get("elsewhere", 0)),
        )
