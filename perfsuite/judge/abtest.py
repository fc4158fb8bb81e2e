"""Interleaved A/B of two Python environments: is the candidate stack slower or hungrier?

``--perf-ab BASE,CANDIDATE`` runs each selected scenario alternately in both
environments (A B A B ..., fresh ranks every launch, ``--perf-repeats``
pairs), on the same machine in the same minutes, so slow drift of the runner
hits both sides alike. Each pair gives the candidate's per-launch mean
relative to the base's launch next to it; a one-sided paired t-test on those
ratios (scipy) asks whether the candidate is worse, and a t-interval gives the
difference with its 95% confidence interval. The scenario's test fails when
the candidate is significantly worse (p < 0.05) by more than the tolerance
(``--perf-ab-tolerance``, default 5%) in its headline throughput or its peak
memory. No baseline is read or written. :mod:`perfsuite.plugin.modes.ab` is the run
mode that drives it; this module knows no pytest. Torch-free.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from perfsuite.spec import metrics as registry
from perfsuite.spec.text import table

#: ``ab-rev``'s relative loss that fails when significant: the paired test removes the drift, not the
#: noise of one run against the next (cpu launches spread 5-10% run to run on a quiet VM).
REV_TOLERANCE = 0.10

FLAG = "--perf-ab"
ALPHA = 0.05
CONFIDENCE = 0.95
Outcome = Literal["pass", "regression", "improved"]


@dataclass(frozen=True)
class Comparison:
    """One metric of the candidate against the base over the pairs."""

    metric: str
    base: tuple[float, ...]
    """The base's per-launch value of each pair."""
    candidate: tuple[float, ...]
    """The candidate's, same order."""
    change: float
    """Mean of candidate / base - 1 over the pairs (+5% = 5% higher)."""
    ci_low: float
    ci_high: float
    """95% t-interval of that mean."""
    p_worse: float
    """One-sided paired t-test p-value of "the candidate is worse"."""
    tolerance: float
    """Worse by more than this (relative) and significant: a regression."""
    outcome: Outcome

    def describe(self) -> str:
        unit = registry.get(self.metric).unit
        return (
            f"{self.metric}: {self.change:+.1%} (95% CI {self.ci_low:+.1%} .. {self.ci_high:+.1%}, "
            f"p(worse) = {self.p_worse:.3g}, {len(self.base)} pairs, base mean "
            f"{statistics.fmean(self.base):.4g} {unit}, tolerance {self.tolerance:.0%})"
        )


def compare(metric: str, base: Sequence[float], candidate: Sequence[float], tolerance: float) -> Comparison:
    """Paired comparison of per-launch values (at least 2 pairs)."""
    from scipy import stats as scipy_stats  # here: 0.8 s that every pytest start would pay (the plugin imports us)

    ratios = [c / b - 1 for b, c in zip(base, candidate, strict=True)]
    n, mean = len(ratios), statistics.fmean(ratios)
    spread = statistics.stdev(ratios) if n > 1 else math.inf
    if spread <= 1e-9 * max(1.0, abs(mean)):
        spread = 0.0  # identical ratios (up to rounding): no noise to test against
    half = float(scipy_stats.t.ppf((1 + CONFIDENCE) / 2, n - 1)) * spread / math.sqrt(n) if n > 1 else math.inf
    higher = registry.get(metric).direction == "higher"
    if spread == 0:
        p_worse = 0.0 if (mean < 0) == higher and mean != 0 else 1.0
        p_better = 0.0 if (mean > 0) == higher and mean != 0 else 1.0
    else:
        worse, better = ("less", "greater") if higher else ("greater", "less")
        p_worse = float(scipy_stats.ttest_1samp(ratios, 0.0, alternative=worse).pvalue)
        p_better = float(scipy_stats.ttest_1samp(ratios, 0.0, alternative=better).pvalue)
    loss = -mean if higher else mean  # > 0: the candidate is worse
    outcome: Outcome = "pass"
    if p_worse < ALPHA and loss > tolerance:
        outcome = "regression"
    elif p_better < ALPHA and -loss > tolerance:
        outcome = "improved"
    return Comparison(
        metric, tuple(base), tuple(candidate), mean, mean - half, mean + half, p_worse, tolerance, outcome
    )


@dataclass(frozen=True)
class Launch:
    """One launch of the scenario in one environment."""

    env: str
    pair: int
    status: str
    values: dict[str, float] = field(default_factory=dict)
    message: str = ""
    contended: str = ""
    """Why it was measured under contention ("" if it was not)."""


@dataclass
class ABResult:
    """A scenario's A/B: every launch in order and the comparisons."""

    id: str
    base: str
    candidate: str
    launches: list[Launch] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    verdict: str = "pass"
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "base": self.base,
            "candidate": self.candidate,
            "verdict": self.verdict,
            "message": self.message,
            "launches": [asdict(launch) for launch in self.launches],
            "comparisons": [asdict(c) for c in self.comparisons],
        }


#: Runs the scenario once in the named environment: (status, metric values,
#: message, why it was contended or "").
RunOnce = Callable[[str], tuple[str, dict[str, float], str, str]]


def run_ab(
    scenario_id: str, metrics: Sequence[str], run_once: RunOnce, base: str, candidate: str, pairs: int,
    tolerances: dict[str, float],
) -> ABResult:  # fmt: skip
    """``pairs`` x (base, candidate) launches, alternating, then the comparisons of ``metrics``.
    A regression among launches measured under contention is ``unreliable``, not a failure."""
    result = ABResult(scenario_id, base, candidate)
    for pair in range(pairs):
        for env in (base, candidate):
            status, values, message, busy = run_once(env)
            result.launches.append(Launch(env, pair, status, values, message, busy))
            if status != "ok":
                result.verdict = "skipped" if status == "skipped" else "error"
                result.message = f"{env} launch {pair + 1} {status}: {message}"
                return result
    for metric in metrics:
        got = [(launch.env, launch.values[metric]) for launch in result.launches if metric in launch.values]
        base_values = [v for env, v in got if env == base]
        cand_values = [v for env, v in got if env == candidate]
        if len(base_values) == len(cand_values) == pairs:
            result.comparisons.append(compare(metric, base_values, cand_values, tolerances[metric]))
    worse = [c for c in result.comparisons if c.outcome == "regression"]
    result.verdict = "regression" if worse else "pass"
    shown = worse or result.comparisons
    result.message = f"{candidate} vs {base}: " + "; ".join(c.describe() for c in shown)
    crowded = "; ".join(f"{x.env} launch {x.pair + 1}: {x.contended}" for x in result.launches if x.contended)
    if worse and crowded:
        result.verdict = "unreliable"
        result.message = f"measured under contention ({crowded}), so not judged a regression: {result.message}"
    return result


def summary_lines(results: Sequence[ABResult]) -> list[str]:
    rows: list[tuple[str, ...]] = []
    for r in results:
        for c in r.comparisons:
            cells = (r.id, c.metric, f"{c.change:+.1%}", f"{c.ci_low:+.1%} .. {c.ci_high:+.1%}", f"{c.p_worse:.3g}")
            contended = r.verdict == "unreliable" and c.outcome == "regression"
            rows.append((*cells, "unreliable (contended)" if contended else c.outcome))
        if not r.comparisons:
            rows.append((r.id, "-", "-", "-", "-", f"{r.verdict}: {r.message[:60]}"))
    return table(("scenario", "metric", "change", "95% CI", "p(worse)", "outcome"), rows)
