"""Judgement: turn a run's outcome and metrics plus a baseline into a verdict.

Direction-aware: throughput must not drop, memory must not grow. A change beyond
tolerance in the good direction passes but flags the baseline as stale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from perfsuite.core import metrics as registry
from perfsuite.judge.stats import ScenarioMetrics, Summary, welch_p_below
from perfsuite.store.baselines import BaselineEntry

Verdict = Literal[
    "pass",
    "regression",
    "improved",
    "expected_oom",
    "unexpected_oom",
    "unexpected_pass",
    "no_baseline",
    "error",
    "skipped",
    "recorded",
    "unreliable",
    "imbalance",
    "definition_changed",
    "other_machine",
    "work_changed",
]
FAILING: frozenset[str] = frozenset(
    {"regression", "unexpected_oom", "unexpected_pass", "error", "imbalance", "definition_changed", "work_changed"}
)
#: One-sided significance level for "the drop is real".
ALPHA = 0.05
#: The chance an unchanged run may fail at least one of the rows whose timing it judges (issue 57:
#: the pull-request tier at or below it), held by Bonferroni's bound over the run's rows
#: (``judging.family_tolerances``).
FAMILY_ALPHA = 0.05


@dataclass(frozen=True)
class FamilyFloor:
    """The loss a row's timed metrics fail beyond, at least, in a run that judges ``rows`` rows'
    timing: the loss an unchanged run of this row exceeds with probability ``FAMILY_ALPHA / rows``
    (Bonferroni; ``perfsuite.judge.simulate.family.floor_for`` computes it from the row's model)."""

    rows: int
    floor: float


@dataclass(frozen=True)
class MetricCheck:
    """One metric compared with its baseline value."""

    metric: str
    current: float
    baseline: float
    tolerance: float
    direction: Literal["higher", "lower"]
    outcome: Literal["pass", "regression", "improved"] = "pass"
    #: One-sided p-value that the current value is worse (None: not tested,
    #: e.g. exact metrics such as model-state bytes).
    p_value: float | None = None

    @property
    def delta(self) -> float:
        """Relative change, signed: +0.10 means 10% more than the baseline."""
        return (self.current - self.baseline) / self.baseline if self.baseline else 0.0

    @property
    def worse(self) -> float:
        """The change for the worse, by the metric's direction: +0.10 is 10% worse."""
        return -self.delta if self.direction == "higher" else self.delta

    def describe(self) -> str:
        p = f", p={self.p_value:.3g}" if self.p_value is not None else ""
        return (
            f"{self.metric}: {self.current:.4g} vs baseline {self.baseline:.4g} "
            f"({self.delta:+.1%}, tolerance {self.tolerance:.0%}{p}, {self.direction} is better)"
        )


def check_metric(check: MetricCheck) -> MetricCheck:
    """Default comparison: a regression is a change for the worse beyond the
    tolerance that is also significant (p < ALPHA) where it was tested."""
    worse = check.worse
    significant = check.p_value is None or check.p_value < ALPHA
    if worse > check.tolerance and significant:
        return replace(check, outcome="regression")
    if -worse > check.tolerance:
        return replace(check, outcome="improved")
    return replace(check, outcome="pass")


#: What a note on a verdict says: metrics it left unjudged, the machine that recorded the
#: baseline, contention, a grown step spread, confirmation measurements, an op profile, the step's work.
NoteKind = Literal["unjudged", "machine", "contention", "spread", "confirmation", "op_profile", "work", "family"]
#: Where a note goes in the message: `` [text]`` after it, ``text `` before it, ``; text`` after it,
#: or on a line of its own after or before it.
Placement = Literal["bracketed", "before", "clause", "line_after", "line_before"]


@dataclass(frozen=True)
class Note:
    """One remark on a verdict, kept apart from the verdict's own message."""

    kind: NoteKind
    text: str
    placement: Placement = "bracketed"

    def around(self, message: str) -> str:
        """``message`` with this note in its place."""
        if self.placement == "before":
            return f"{self.text} {message}"
        if self.placement == "clause":
            return f"{message}; {self.text}"
        if self.placement == "line_after":
            return f"{message}\n{self.text}"
        if self.placement == "line_before":
            return f"{self.text}\n{message}"
        return f"{message} [{self.text}]"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    #: What the verdict itself says; :attr:`message` adds the notes.
    base_message: str
    checks: tuple[MetricCheck, ...] = ()
    stack_changes: tuple[str, ...] = field(default_factory=tuple)
    #: Remarks on the verdict, in the order they were made; each wraps the message before it.
    notes: tuple[Note, ...] = ()

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    @property
    def message(self) -> str:
        """The message as printed and stored: the verdict's own, with every note in its place."""
        message = self.base_message
        for note in self.notes:
            message = note.around(message)
        return message

    def noted(self, note: Note) -> Judgement:
        """This judgement with ``note`` added after the notes it has."""
        return replace(self, notes=(*self.notes, note))

    def notes_of(self, kind: NoteKind) -> tuple[Note, ...]:
        """Its notes of ``kind``."""
        return tuple(note for note in self.notes if note.kind == kind)


def resolve_tolerances(
    profile_defaults: Mapping[str, float],
    scenario: Mapping[str, float],
    baseline: BaselineEntry | None,
) -> dict[str, float]:
    """Baseline (hand-set or calibrated) beats scenario beats the profile's
    default (which is the metric's registry default unless the profile sets one)."""
    merged = dict(profile_defaults)
    merged.update(scenario)
    if baseline is not None:
        merged.update(baseline.tolerances)
    return merged


def judge_outcome(status: str, expected: str, baseline: BaselineEntry | None, limit: str = "") -> Judgement | None:
    """Verdicts decided by the outcome alone (OOM expectations, missing baseline); ``limit``
    names the memory limit a rank ran into, when the profile sets one."""
    if status == "oom":
        if expected == "oom":
            return Judgement("expected_oom", f"ran out of memory{f' under {limit}' if limit else ''}, as expected")
        return Judgement(
            "unexpected_oom",
            "ran out of memory where it was expected to fit; if the new footprint is "
            "intended, record the OOM as expected with --perf-update-baselines --perf-accept-oom ID",
        )
    if expected == "oom":
        return Judgement(
            "unexpected_pass",
            "trained although an out-of-memory was expected: the footprint shrank or "
            "the limit grew; update the baseline with --perf-update-baselines",
        )
    if baseline is None:
        return Judgement("no_baseline", "no baseline recorded")
    return None


def worse_p_value(current: Summary, baseline: Mapping[str, Any], direction: str) -> float | None:
    """One-sided Welch t-test that ``current`` is worse than the baseline's
    stored mean/std/n; None where either side has too few samples."""
    n_base = int(baseline.get("n", 0))
    if current.n < 2 or n_base < 2:
        return None
    base_mean, base_std = float(baseline["mean"]), float(baseline.get("std", 0.0))
    if direction == "higher":  # worse is lower
        p = welch_p_below(current.mean, current.std, current.n, base_mean, base_std, n_base)
    else:  # worse is higher: the baseline lies below the current value
        p = welch_p_below(base_mean, base_std, n_base, current.mean, current.std, current.n)
    return p if math.isfinite(p) else None


def welch_interval(old: Summary, new: Summary, confidence: float) -> tuple[float, float] | None:
    """Welch's t-interval of NEW's mean less OLD's, from each side's mean, std and count: the two
    runs' spreads need not match (another machine, another night), so no pooled variance. Steps
    count as independent samples, as the gate's Welch test counts them. None where a side has
    fewer than 2 samples."""
    if old.n < 2 or new.n < 2:
        return None
    from scipy.special import stdtrit  # scipy.stats would cost a second more (stats.welch_p_below)

    a, b = old.std**2 / old.n, new.std**2 / new.n
    diff = new.mean - old.mean
    if a + b == 0:
        return diff, diff
    df = (a + b) ** 2 / (a**2 / (old.n - 1) + b**2 / (new.n - 1))  # Welch-Satterthwaite
    half = float(stdtrit(df, (1 + confidence) / 2)) * math.sqrt(a + b)
    return diff - half, diff + half


def judge_metrics(
    metrics: ScenarioMetrics,
    baseline: BaselineEntry,
    tolerances: Mapping[str, float],
    compare: Callable[[MetricCheck], MetricCheck] = check_metric,
    names: Sequence[str] | None = None,
) -> Judgement:
    """Compare every metric of ``names`` (default: all measured) that has both a
    baseline value and a tolerance. Noisy metrics kept with their spread get
    the significance test; exact ones are compared as they are."""
    checks = []
    for name in names if names is not None else list(metrics.values):
        base = baseline.value(name)
        if base is None or name not in tolerances or name not in metrics.values:
            continue
        metric = registry.get(name)
        p_value = None
        stored, current = baseline.metrics.get(name), metrics.summary(name)
        if metric.noisy and isinstance(stored, Mapping) and current is not None:
            p_value = worse_p_value(current, stored, metric.direction)
        checks.append(
            compare(MetricCheck(name, metrics.value(name), base, tolerances[name], metric.direction, p_value=p_value))
        )
    regressions = [c for c in checks if c.outcome == "regression"]
    improvements = [c for c in checks if c.outcome == "improved"]
    if regressions:
        return Judgement("regression", "; ".join(c.describe() for c in regressions), tuple(checks))
    if improvements:
        return Judgement(
            "improved",
            "better than baseline beyond tolerance, the baseline is stale "
            "(refresh with --perf-update-baselines): " + "; ".join(c.describe() for c in improvements),
            tuple(checks),
        )
    return Judgement("pass", "within tolerance of baseline", tuple(checks))


def judge_imbalance(metrics: ScenarioMetrics, limits: Mapping[str, float]) -> Judgement | None:
    """A straggler rank or lopsided stage beyond the scenario's max/min limits."""
    over = [
        f"{name} max/min across ranks {metrics.imbalance(name):.2f} > limit {limit:.2f}"
        for name, limit in limits.items()
        if metrics.imbalance(name) > limit
    ]
    if not over:
        return None
    per_rank = ", ".join(
        f"rank {r['rank']}: " + " ".join(f"{name} {r[name]:.4g}" for name in limits) for r in metrics.per_rank
    )
    return Judgement("imbalance", "; ".join(over) + f" ({per_rank})")
