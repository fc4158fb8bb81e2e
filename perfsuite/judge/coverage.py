"""Coverage is a verdict: how many selected scenarios the gate judged, and why the others were not.

A gate that judged nothing must not be green. Every run ends with one line,
``judged 41 of 45 selected scenario(s); not judged: 3 unreliable, 1 no baseline``,
which also goes into the results file and the summaries. A run in which a
scenario that should be judged here was not (``unreliable``, ``no_baseline``,
or not recorded under ``--perf-update-baselines``) fails, unless
``--perf-allow-unjudged`` opts the whole run out. Scenarios skipped for a
stated reason (too few GPUs, another profile, a missing environment) are
listed apart: this machine cannot judge them, and saying so is enough. Those
skipped because an engine's package is not installed are counted apart from
them and grouped by the extra that installs it, with the pip command: skips
all the same (a runner need not install every engine), but ones a pip install
would judge.
Quarantined scenarios (:mod:`perfsuite.store.quarantine`) run and are reported, but
do not gate; they are counted apart too. So are ``other_machine`` scenarios:
their baseline's processor is not this one, so only their memory was judged
(they count as judged; their timing is listed apart with what would judge it).
Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perfsuite.core import metrics
from perfsuite.core.engines import MissingPackage

#: Verdicts by which the gate has spoken, for better or worse (``searched``: a max-batch
#: search that trained or ran out of memory at least once).
JUDGED = frozenset(
    {
        "pass",
        "regression",
        "improved",
        "expected_oom",
        "unexpected_oom",
        "unexpected_pass",
        "imbalance",
        "error",
        "recorded",
        "searched",
        "other_machine",
        "work_changed",
    }
)
#: The judged verdict whose timing was not: its baseline came from another processor.
TIMING_ELSEWHERE = "other_machine"
#: What would judge such a scenario's timing.
TIMING_FIX = (
    "record this machine's baselines (pytest ... --perf-update-baselines), or compare against a "
    "revision on this machine: python -m perfsuite ab-rev HEAD~1 -k ..."
)
#: Verdicts that leave a scenario unjudged where it should have been judged, with what fixes each.
UNJUDGED: Mapping[str, str] = {
    "unreliable": "rerun on a quiet runner (see each scenario's contention or throttling)",
    "no_baseline": "record baselines: python -m perfsuite bootstrap, or pytest ... --perf-update-baselines",
    "not_measured": "the max-batch search never trained nor ran out of memory: see its message",
    "definition_changed": "the scenario changed since its baseline: re-record it with --perf-update-baselines",
    "undecided": "the A/B spent its pairs without deciding: allow more pairs (--perf-ab-max-pairs, ab-rev "
    "--max-pairs), a quieter runner, or a larger minimum effect (--perf-min-effect)",
}


@dataclass(frozen=True)
class Outcome:
    """What coverage needs of one scenario's result."""

    id: str
    verdict: str
    message: str = ""
    quarantined: bool = False
    missing: MissingPackage | None = None
    """The engine package whose absence skipped it, when that is why."""
    work: str = ""
    """The work gate's status (``perfsuite.judge.work.WorkStatus``); "" where no work was counted."""
    timing: bool = False
    """A timed metric (samples/s, TFLOP/s: ``Metric.timed``) was compared: the processor's speed."""
    memory: bool = False
    """Memory or byte counts were compared, or an out-of-memory expectation: the same on any processor."""


#: Verdicts that judged an out-of-memory expectation: memory, whatever the checks.
OOM_VERDICTS = frozenset({"expected_oom", "unexpected_oom", "unexpected_pass"})


def kinds_judged(compared: Iterable[str], verdict: str) -> tuple[bool, bool]:
    """(timing, memory): whether the metrics a result compared with its baseline (``compared``,
    by name) judged the processor's speed, memory and byte counts, or both."""
    timed = [metrics.get(name).timed for name in compared if name in metrics.METRICS]
    return any(timed), not all(timed) or verdict in OOM_VERDICTS


@dataclass(frozen=True)
class NotInstalled:
    """Skipped rows whose engines one install would bring: ``perfsuite[megatron]`` and its command."""

    needs: str
    install: str
    ids: tuple[str, ...]

    def describe(self) -> str:
        rows = f"{len(self.ids)} row needs" if len(self.ids) == 1 else f"{len(self.ids)} rows need"
        return f"not installed: {rows} {self.needs} ({self.install}): {_shown(self.ids)}"

    def to_json(self) -> dict[str, Any]:
        return {"needs": self.needs, "install": self.install, "scenarios": list(self.ids)}


@dataclass(frozen=True)
class Coverage:
    selected: int
    judged: tuple[str, ...] = ()
    unjudged: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Verdict (``unreliable``, ``no_baseline``) -> ids: these fail the run."""
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Id -> why it cannot run on this machine: listed, never failing."""
    quarantined: tuple[str, ...] = ()
    unreliable_causes: tuple[str, ...] = ()
    """The first measured cause per unreliable scenario, for the line."""
    timing_elsewhere: tuple[str, ...] = ()
    """Judged on memory only: their baselines were recorded on another processor."""
    not_installed: tuple[NotInstalled, ...] = ()
    """Skipped ones (also in ``skipped``) whose engine is not installed, by what installs it."""
    work_judged: tuple[str, ...] | None = None
    """Those whose step work was judged exactly (None: the run counted no work)."""
    timing_judged: tuple[str, ...] = ()
    memory_judged: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing that should be judged here went unjudged, and something was judged."""
        return not self.unjudged and (bool(self.judged) or not self.selected or self._only_skipped)

    @property
    def _only_skipped(self) -> bool:
        # Everything skipped for a reason: nothing_measured already fails that run, with its own words.
        return len(self.skipped) == self.selected

    def line(self) -> str:
        parts = [f"judged {len(self.judged)} of {self.selected} selected scenario(s)"]
        if self.unjudged:
            parts.append("not judged: " + ", ".join(self._unjudged_texts()))
        if self.quarantined:
            parts.append(f"quarantined (run, not gating): {len(self.quarantined)}")
        uninstalled = sum(len(group.ids) for group in self.not_installed)
        if len(self.skipped) > uninstalled:
            parts.append(f"not for this machine: {len(self.skipped) - uninstalled}")
        if uninstalled:
            parts.append(f"engine not installed: {uninstalled}")
        if self.timing_elsewhere:
            parts.append(f"timing not judged, baseline from another processor: {len(self.timing_elsewhere)}")
        parts.append(self.by_kind())
        return "; ".join(parts)

    def by_kind(self) -> str:
        """How many rows each kind of judgement reached: the exact ones (step work, memory) on any
        processor, timing only against this processor's own baselines."""
        work = f"work {len(self.work_judged)}, " if self.work_judged is not None else ""
        return f"judged: {work}memory {len(self.memory_judged)}, timing {len(self.timing_judged)} of {self.selected}"

    def notes(self) -> list[str]:
        """What the line leaves unjudged without failing the run, and what would judge it."""
        found = [group.describe() for group in self.not_installed]
        if self.timing_elsewhere:
            found.append(f"{TIMING_ELSEWHERE}: {_shown(self.timing_elsewhere)}: judged on memory only; {TIMING_FIX}")
        return found

    def _unjudged_texts(self) -> list[str]:
        texts = []
        for verdict, ids in self.unjudged.items():
            cause = f" ({self.unreliable_causes[0]})" if verdict == "unreliable" and self.unreliable_causes else ""
            texts.append(f"{len(ids)} {verdict.replace('_', ' ')}{cause}")
        return texts

    def fixes(self) -> list[str]:
        """What to do about each kind of unjudged scenario, naming them."""
        found = []
        for verdict, ids in self.unjudged.items():
            found.append(f"{verdict}: {_shown(ids)}: {UNJUDGED.get(verdict, 'see its message')}")
        if not self.judged and self.selected and not self.unjudged and not self._only_skipped:
            found.append("nothing was judged: see each scenario's message")
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line(),
            "ok": self.ok,
            "selected": self.selected,
            "judged": list(self.judged),
            "unjudged": {k: list(v) for k, v in self.unjudged.items()},
            "quarantined": list(self.quarantined),
            "skipped": dict(self.skipped),
            "not_installed": [group.to_json() for group in self.not_installed],
            "timing_elsewhere": list(self.timing_elsewhere),
            "work_judged": None if self.work_judged is None else list(self.work_judged),
            "timing_judged": list(self.timing_judged),
            "memory_judged": list(self.memory_judged),
            "fixes": self.fixes(),
            "notes": self.notes(),
        }


def _shown(ids: tuple[str, ...]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def coverage_of(outcomes: Iterable[Outcome]) -> Coverage:
    """Sort each outcome into judged, unjudged (by verdict), quarantined or skipped here."""
    items = list(outcomes)
    judged, quarantined, causes = [], [], []
    unjudged: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    for item in items:
        if item.quarantined:
            quarantined.append(item.id)
        elif item.verdict in JUDGED:
            judged.append(item.id)
        elif item.verdict == "skipped":
            skipped[item.id] = item.message
        else:
            unjudged.setdefault(item.verdict, []).append(item.id)
            if item.verdict == "unreliable":
                causes.append(_cause(item.message))
    elsewhere = tuple(item.id for item in items if item.verdict == TIMING_ELSEWHERE and not item.quarantined)
    counted = any(item.work for item in items)
    work = tuple(i.id for i in items if i.work and i.work != "not_judged" and not i.quarantined) if counted else None
    gating = [item for item in items if not item.quarantined]
    return Coverage(
        len(items),
        tuple(judged),
        {k: tuple(v) for k, v in unjudged.items()},
        skipped,
        tuple(quarantined),
        tuple(causes),
        elsewhere,
        not_installed(items),
        work,
        tuple(item.id for item in gating if item.timing),
        tuple(item.id for item in gating if item.memory),
    )


def not_installed(outcomes: Iterable[Outcome]) -> tuple[NotInstalled, ...]:
    """The skipped outcomes whose engine is not installed, grouped by what installs them (one
    extra may bring several modules), in the order first seen."""
    groups: dict[tuple[str, str], list[str]] = {}
    for item in outcomes:
        if item.verdict == "skipped" and not item.quarantined and item.missing is not None:
            groups.setdefault((item.missing.needs, item.missing.install), []).append(item.id)
    return tuple(NotInstalled(needs, install, tuple(ids)) for (needs, install), ids in groups.items())


def _cause(message: str) -> str:
    """The short cause of an unreliable verdict: the contention it names, else its first clause."""
    marker = "measured under contention ("
    at = message.find(marker)
    if at < 0:
        return message.split(":")[0][:90]
    depth, text = 1, message[at + len(marker) :]
    for end, char in enumerate(text):  # up to the parenthesis that closes the marker's
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[:end].split(";")[0][:90]
    return text.split(";")[0][:90]
