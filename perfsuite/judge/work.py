"""The work gate: a scenario's counted step work against its recorded counts, and what that
does to the scenario's verdict.

:func:`decide` is pure: it returns a :class:`WorkVerdict` and touches nothing. :func:`applied`
turns a timing-and-memory judgement into the scenario's final one:

* a costed growth (:func:`perfsuite.core.workcount.compare`: a new host sync, collective call,
  compiled graph or graph break; more op calls, bytes read by ops, collective bytes or device kernels) fails the
  scenario as ``work_changed`` on any machine, whatever the timing said; a scenario that already
  failed gets the change as the line before its message, since it is likely the cause;
* a different op mix with nothing costed growing passes, the difference noted;
* unchanged work under a timing regression says the slowdown is in how the step runs (a
  library, a driver, the machine), not in what it does.

Counts are not judged when the run has none, the counted steps differed, the recording was made
under other library versions or at another number of ranks; the verdict then says which.
Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from perfsuite.core.workcount import WorkCount, WorkDiff, compare
from perfsuite.judge.compare import Judgement, Note, Verdict
from perfsuite.store.workstore import StoredWork

WorkStatus = Literal["unchanged", "changed", "failed", "not_judged"]
#: The verdict a costed growth in work gives a scenario (one of ``compare.FAILING``).
WORK_CHANGED: Verdict = "work_changed"
#: Library versions whose change changes the ops a step calls by design.
LIBRARIES = ("torch", "deepspeed", "transformers", "fairscale", "megatron-core", "onnxruntime-training")
RECORD = "record the counts again with --perf-update-baselines"
#: Verdicts under which the counts say nothing: the step did not run as measured, or is not the recorded one.
UNMEASURED = frozenset({"skipped", "error", "expected_oom", "unexpected_oom", "unexpected_pass", "definition_changed"})


@dataclass(frozen=True)
class WorkVerdict:
    """What the work gate found for one scenario."""

    status: WorkStatus
    message: str
    diff: WorkDiff | None = None

    @property
    def judged(self) -> bool:
        return self.status != "not_judged"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "diff": self.diff.to_json() if self.diff else None}


def decide(
    stored: StoredWork | None, current: WorkCount | None, packages: Mapping[str, str], wanted: bool = True
) -> WorkVerdict:
    """``current`` (this run's counts, ``None``: none were counted) against ``stored``; ``wanted``
    False (the scenario's ``judge_work``): the difference shown, never judged."""
    why = _unjudgeable(stored, current, packages)
    if why is not None:
        return WorkVerdict("not_judged", f"work not judged: {why}")
    assert stored is not None and current is not None  # _unjudgeable said so
    diff = compare(stored.count, current)
    if not wanted:
        return WorkVerdict(
            "not_judged", f"work not judged (the scenario sets judge_work=False): {diff.describe()}", diff
        )
    if diff.failed:
        return WorkVerdict("failed", f"step work changed: {diff.describe()}", diff)
    if diff.changed:
        return WorkVerdict("changed", f"step work: {diff.describe()} (nothing costed grew)", diff)
    return WorkVerdict("unchanged", "step work unchanged", diff)


def _unjudgeable(stored: StoredWork | None, current: WorkCount | None, packages: Mapping[str, str]) -> str | None:
    if current is None:
        return "this run counted none"
    if not current.steady:
        shown = f": {', '.join(current.varied[:3])}" if current.varied else ""
        return f"the counted steps differed from each other (data-dependent work, or a skipped fp16 step){shown}"
    if stored is None:
        return f"no recorded counts; {RECORD}"
    moved = [
        f"{name} {stored.packages.get(name, '-')} -> {packages.get(name, '-')}"
        for name in LIBRARIES
        if stored.packages.get(name) != packages.get(name)
    ]
    if moved:
        return f"the environment changed since the counts were recorded ({', '.join(moved)}); {RECORD}"
    if stored.count.ranks != current.ranks:
        return f"recorded over {stored.count.ranks} rank(s), this run has {current.ranks}; {RECORD}"
    return None


def applied(judgement: Judgement, work: WorkVerdict) -> Judgement:
    """``judgement`` with the work gate's finding in it (see the module's rules)."""
    if judgement.verdict in UNMEASURED or judgement.verdict == "recorded" or not work.judged:
        return judgement
    if work.status == "failed":
        if judgement.failed:
            return judgement.noted(Note("work", work.message, "line_before"))
        return Judgement(WORK_CHANGED, work.message, judgement.checks, judgement.stack_changes).noted(
            Note("work", f"timing and memory: {judgement.verdict}", "clause")
        )
    if work.status == "changed":
        return judgement.noted(Note("work", work.message, "clause"))
    if judgement.verdict == "regression":
        why = "step work unchanged: the slowdown is in how the step runs (a library, driver or the machine), not what it does"
        return judgement.noted(Note("work", why, "clause"))
    return judgement
