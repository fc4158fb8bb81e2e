"""Interleaved A/B of two Python environments: is the candidate stack slower or hungrier?

``--perf-ab BASE,CANDIDATE`` runs each selected scenario alternately in both environments, fresh
ranks every launch, on the same machine in the same minutes, so slow drift of the runner hits both
sides alike; which side goes first alternates pair by pair. The headline metric is judged
sequentially (:mod:`perfsuite.judge.sequential`): after each pair ``regression``, ``pass`` (no
slowdown of the minimum effect or more), or another pair, up to ``max_pairs``, then
``undecided``. The other metrics (peak memory) keep the fixed paired test on the pairs measured:
the candidate fails when significantly worse (p < 0.05) by more than the metric's tolerance. No
baseline is read or written. :mod:`perfsuite.plugin.modes.ab` is the run mode that drives it and
``ab-rev`` the command; this module knows no pytest. Torch-free.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from perfsuite.core import metrics as registry
from perfsuite.core.text import table
from perfsuite.core.workcount import WorkDiff
from perfsuite.judge import sequential
from perfsuite.judge.results import OneLaunch
from perfsuite.judge.sequential import Design, State

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


@dataclass(frozen=True)
class Headline:
    """The sequential A/B of the headline metric (:mod:`perfsuite.judge.sequential`)."""

    metric: str
    design: Design
    state: State
    losses: tuple[float, ...]
    """Each pair's loss, ``log(base / candidate)`` for a higher-is-better metric."""

    def describe(self) -> str:
        return f"{self.metric}: {self.state.describe(self.design)}"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "design": asdict(self.design), **asdict(self.state), "losses": self.losses}


@dataclass
class ABResult:
    """A scenario's A/B: every launch in order, the headline's sequential verdict, the other
    metrics' comparisons."""

    id: str
    base: str
    candidate: str
    launches: list[Launch] = field(default_factory=list)
    headline: Headline | None = None
    comparisons: list[Comparison] = field(default_factory=list)
    verdict: str = "pass"
    message: str = ""
    dropped: list[str] = field(default_factory=list)
    """The pairs left out because a side was measured under contention: which and why."""
    work: WorkDiff | None = None
    """The candidate's counted step work against the base's (``ab-rev``, ``bisect``: their first
    pair in which both sides counted); None where a side counted none."""

    @property
    def judged(self) -> bool:
        """Compared on both sides and decided: pass or regression (not undecided, not failed)."""
        return self.verdict in ("pass", "regression")

    @property
    def pairs(self) -> int:
        return self.headline.state.pairs if self.headline else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "base": self.base,
            "candidate": self.candidate,
            "verdict": self.verdict,
            "message": self.message,
            "pairs": self.pairs,
            "headline": self.headline.to_json() if self.headline else None,
            "launches": [asdict(launch) for launch in self.launches],
            "comparisons": [asdict(c) for c in self.comparisons],
            "dropped_pairs": list(self.dropped),
            "work": self.work.to_json() if self.work else None,
        }


#: Runs the scenario once in the named environment.
RunOnce = Callable[[str], OneLaunch]


class Trial:
    """One scenario's sequential A/B as its launches arrive, pair by pair (``run_ab`` drives it
    in one process; ``ab-rev`` feeds it from whole pytest runs)."""

    def __init__(
        self,
        scenario_id: str,
        metrics: Sequence[str],
        base: str,
        candidate: str,
        design: Design,
        tolerances: Mapping[str, float],
    ) -> None:
        self.result = ABResult(scenario_id, base, candidate)
        self.metrics, self.design, self.tolerances = tuple(metrics), design, dict(tolerances)
        self.open = True

    def add(self, env: str, launch: OneLaunch) -> None:
        """One launch in ``env``; a failed launch ends the A/B as ``error`` (``skipped`` when it
        could not run here)."""
        status, values, message, busy = launch.status, launch.values, launch.message, launch.contended or ""
        headline = values.get(self.metrics[0])
        if status == "ok" and headline is not None and not headline > 0:  # a ratio needs a rate above 0
            status, message = "error", f"measured {self.metrics[0]} = {headline}: no rate to compare"
        pair = sum(1 for x in self.result.launches if x.env == env)
        self.result.launches.append(Launch(env, pair, status, values, message, busy))
        if status != "ok":
            self.result.verdict = "skipped" if status == "skipped" else "error"
            self.result.message = f"{env} launch {pair + 1} {status}: {message}"
            self.open = False

    def drop(self, why: str) -> None:
        """Leave a whole pair out, ``why`` (a side was measured under contention): a neighbour's
        load that hits one side would be read as that side's speed."""
        self.result.dropped.append(why)

    def look(self, final: bool = False) -> None:
        """After a whole pair: decide, or stay open for another (``final``: no more will come)."""
        if not self.open:
            return
        pairs = self._pairs(self.metrics[0])
        if not pairs:
            if final and self.result.dropped:
                self.open = False
                self._all_dropped()
            return
        final = final or len(pairs) >= self.design.max_pairs
        higher = registry.get(self.metrics[0]).direction == "higher"
        losses = tuple(sequential.loss(b, c, higher) for b, c in pairs)
        state = sequential.assess(self.design, losses, final)
        self.result.headline = Headline(self.metrics[0], self.design, state, losses)
        if state.decision != "continue":
            self.open = False
            self._conclude()

    def _all_dropped(self) -> None:
        """Every pair was dropped and no more will come."""
        dropped = self.result.dropped
        self.result.verdict = "unreliable"
        self.result.message = f"all {len(dropped)} pair(s) measured under contention, so none compared: {dropped[-1]}"

    def _pairs(self, metric: str) -> list[tuple[float, float]]:
        sides = {
            env: [x.values[metric] for x in self.result.launches if x.env == env and metric in x.values]
            for env in (self.result.base, self.result.candidate)
        }
        return list(zip(sides[self.result.base], sides[self.result.candidate], strict=True))

    def _conclude(self) -> None:
        result, headline = self.result, self.result.headline
        assert headline is not None  # concluded by a look
        for metric in self.metrics[1:]:
            pairs = self._pairs(metric)
            if len(pairs) >= 2:
                base, candidate = zip(*pairs, strict=True)
                result.comparisons.append(compare(metric, base, candidate, self.tolerances[metric]))
        worse = [c for c in result.comparisons if c.outcome == "regression"]
        decision = headline.state.decision
        result.verdict = "regression" if worse or decision == "regression" else decision
        said = ([headline.describe()] if decision != "pass" or not worse else []) + [c.describe() for c in worse]
        result.message = f"{result.candidate} vs {result.base}: " + "; ".join(said)
        crowded = "; ".join(f"{x.env} launch {x.pair + 1}: {x.contended}" for x in result.launches if x.contended)
        if result.verdict == "regression" and crowded:
            result.verdict = "unreliable"
            result.message = f"measured under contention ({crowded}), so not judged a regression: {result.message}"
        elif result.verdict == "undecided" and result.dropped:
            result.verdict = "unreliable"
            result.message = (
                f"undecided with {len(result.dropped)} pair(s) dropped as measured under contention "
                f"(last: {result.dropped[-1]}): {result.message}"
            )


def run_ab(
    scenario_id: str,
    metrics: Sequence[str],
    run_once: RunOnce,
    base: str,
    candidate: str,
    design: Design,
    tolerances: Mapping[str, float],
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ABResult:
    """Pairs of (base, candidate) launches, the order alternating pair by pair, until the headline
    metric (``metrics[0]``) decides, ``design.max_pairs`` are spent, or ``budget_s`` seconds have
    passed (then ``undecided``); the other metrics are compared on the pairs measured. A
    regression among launches measured under contention is ``unreliable``, not a failure."""
    trial = Trial(scenario_id, metrics, base, candidate, design, tolerances)
    started = clock()
    for pair in range(design.max_pairs):
        for env in (base, candidate) if sequential.base_first(pair) else (candidate, base):
            trial.add(env, run_once(env))
            if not trial.open:
                return trial.result
        trial.look(final=budget_s is not None and clock() - started >= budget_s)
        if not trial.open:
            break
    return trial.result


def summary_lines(results: Sequence[ABResult]) -> list[str]:
    """The terminal table: the headline's slowdown and its pairs, then each other metric's change."""
    rows: list[tuple[str, ...]] = []
    for r in results:
        if r.headline is not None:
            state = r.headline.state
            rows.append(
                (
                    r.id,
                    f"{r.headline.metric} (slowdown)",
                    f"{state.slowdown:+.1%}",
                    _interval(state),
                    f"{r.pairs}{_dropped(r)}",
                    _outcome(r, state.decision),
                )
            )
        for c in r.comparisons:
            cells = (r.id, c.metric, f"{c.change:+.1%}", f"{c.ci_low:+.1%} .. {c.ci_high:+.1%}", str(len(c.base)))
            rows.append((*cells, _outcome(r, c.outcome)))
        if r.headline is None:
            rows.append((r.id, "-", "-", "-", "-", f"{r.verdict}: {r.message[:60]}"))
        if r.work is not None:
            rows.append((r.id, "step work", "changed" if r.work.changed else "none", "exact", "-", _work(r.work)))
    return table(("scenario", "metric", "change", "interval", "pairs", "outcome"), rows)


def markdown_lines(results: Sequence[ABResult], title: str) -> list[str]:
    """A job summary (GitHub's ``$GITHUB_STEP_SUMMARY``): each row's verdict, slowdown with its
    interval, the minimum effect and the pairs spent."""
    lines = [
        f"### {title}",
        "",
        "| scenario | verdict | slowdown | interval | minimum effect | pairs |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.headline is None:
            lines.append(f"| `{r.id}` | {r.verdict} | - | - | - | {r.message[:80]} |")
            continue
        state, design = r.headline.state, r.headline.design
        lines.append(
            f"| `{r.id}` | {r.verdict} | {state.slowdown:+.1%} | {_interval(state)} | "
            f"{design.min_effect:.1%} | {r.pairs} of {design.max_pairs}{_dropped(r)} |"
        )
    changed = work_lines(results)
    return [*lines, *(["", "Step work (exact):", "", *[f"- {line}" for line in changed]] if changed else [])]


def _work(diff: WorkDiff) -> str:
    """The step work's outcome: costed growth fails the gate, a mix change is only shown."""
    if not diff.changed:
        return "unchanged"
    return f"{'grew' if diff.failed else 'other mix'}: {diff.describe()[:100]}"


def work_lines(results: Sequence[ABResult]) -> list[str]:
    """What each scenario's step does differently on the candidate, exactly: said before any timing."""
    return [f"{r.id}: step work changed: {r.work.describe()}" for r in results if r.work and r.work.changed]


def _dropped(result: ABResult) -> str:
    """The pairs dropped as measured under contention, if any."""
    return f" (+{len(result.dropped)} dropped: contended)" if result.dropped else ""


def _interval(state: State) -> str:
    return f"{state.low:+.1%} .. {state.high:+.1%}" if math.isfinite(state.low) else "-"


def _outcome(result: ABResult, outcome: str) -> str:
    contended = result.verdict == "unreliable" and outcome == "regression"
    return "unreliable (contended)" if contended else outcome
