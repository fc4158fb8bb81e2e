"""Summary statistics and the aggregation of per-rank raw measurements.

Ranks return raw step times and their own values of ``rank``-source metrics;
everything derived (rates, percentiles, the worst rank) is computed here, in
one place and by the rules of each metric's registry entry, so the results
file, the summary table and the verdict agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from perfsuite.core import metrics as registry
from perfsuite.core.protocol import RankReport
from perfsuite.judge.contention import Contention
from perfsuite.judge.contention import measure as measure_contention

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    #: A number, or numpy's array of them: the gate tests one row, the simulation thousands at once.
    Numbers = TypeVar("Numbers", float, NDArray[np.float64])


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("cannot summarise an empty sample")
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(mean=statistics.fmean(values), std=std, n=len(values))

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean)."""
        return self.std / self.mean if self.mean else math.inf


def welch_p_below(
    new_mean: Numbers, new_std: Numbers, new_n: int, old_mean: Numbers, old_std: Numbers, old_n: int
) -> Numbers:
    """One-sided Welch t-test that NEW's mean lies below OLD's, from each side's mean, sample
    standard deviation and count: scipy's ``ttest_ind_from_stats(..., equal_var=False,
    alternative="less")``, with its rule that zero variances leave the degrees of freedom free (1),
    as a ufunc over arrays too. scipy.special's t distribution instead of scipy.stats: importing
    scipy.stats costs every pytest run that judges a row about 1 s of CPU (the gate's own
    self-tests start a few hundred), and its argument handling milliseconds a call."""
    import numpy as np
    from scipy.special import stdtr

    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = np.asarray(new_std, np.float64) ** 2 / new_n, np.asarray(old_std, np.float64) ** 2 / old_n
        df = (a + b) ** 2 / (a**2 / (new_n - 1) + b**2 / (old_n - 1))  # Welch-Satterthwaite
        t = (new_mean - old_mean) / np.sqrt(a + b)
        p = stdtr(np.where(np.isnan(df), 1.0, df), t)
    return p if isinstance(p, np.ndarray) and p.ndim else float(p)  # type: ignore[return-value]


#: A metric's value: a Summary for metrics kept with their spread, else a number.
Value = Summary | float


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100] (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("cannot take a percentile of an empty sample")
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class ScenarioMetrics:
    """Metrics of one successful measurement (one or more launches)."""

    values: Mapping[str, Value]
    """Every metric the scenario's kind produces, by registry name."""
    step_time_median_s: float
    step_time_p90_s: float
    step_times_s: list[float]
    """Slowest-rank time of each measured step whose update was applied (all launches)."""
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    """Each rank's own figures (first launch)."""
    steady_state_start: int = 0
    """Warmup steps run before measuring (first launch)."""
    warmup_times_s: list[float] = field(default_factory=list)
    """Slowest-rank time of each warmup step (first launch): the report plots them."""
    health: list[dict[str, Any]] = field(default_factory=list)
    """Per rank, first launch."""
    repeats: list[dict[str, Any]] = field(default_factory=list)
    """Each launch's value of every metric."""
    skipped_steps: int = 0
    """Measured steps left out because the engine skipped their update (fp16
    overflow): they did no training, and skipping is faster."""
    step_work: Mapping[str, float] = field(default_factory=dict)
    """Work per step behind each rate (first launch; each launch's own is used when pooling)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Rank 0's kind-specific facts (first launch)."""
    detail_varies: tuple[str, ...] = ()
    """Keys of ``detail`` whose value differed between launches (a best-shape search that picked
    another shape): a figure that follows such a pick mixes the launches' picks."""
    contention: Contention | None = None
    """What other processes took while the steps were measured (the worst launch)."""

    def value(self, name: str) -> float:
        """The number compared with baselines and in relations (a Summary's mean)."""
        v = self.values[name]
        return v.mean if isinstance(v, Summary) else float(v)

    def summary(self, name: str) -> Summary | None:
        v = self.values.get(name)
        return v if isinstance(v, Summary) else None

    def imbalance(self, name: str) -> float:
        """max / min across ranks of a per-rank figure (1.0 = balanced)."""
        values = [float(rank[name]) for rank in self.per_rank]
        return max(values) / min(values) if values and min(values) > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            **{name: asdict(v) if isinstance(v, Summary) else v for name, v in self.values.items()},
            "step_time_s": {"median": self.step_time_median_s, "p90": self.step_time_p90_s},
            "per_rank": self.per_rank,
            "step_times_s": self.step_times_s,
            "steady_state_start": self.steady_state_start,
            "warmup_times_s": self.warmup_times_s,
            "health": self.health,
            "repeats": self.repeats,
            "skipped_steps": self.skipped_steps,
            **({"detail": dict(self.detail)} if self.detail else {}),
            **({"detail_varies": list(self.detail_varies)} if self.detail_varies else {}),
            **({"contention": self.contention.to_json()} if self.contention else {}),
        }

    def repeat_summary(self) -> dict[str, Any]:
        return {**{name: self.value(name) for name in self.values}, "step_time_median_s": self.step_time_median_s}


def aggregate(ranks: Sequence[RankReport], work: Mapping[str, float], names: Sequence[str]) -> ScenarioMetrics:
    """Combine the reports of one launch into the metrics ``names``.

    A synchronous step is as slow as its slowest rank, so rates use the max
    over ranks of each step's time; ``rank`` metrics combine by their entry's
    ``across_ranks`` (max: the worst rank). Steps whose update any rank
    skipped are left out of the rates and step times. Work the ranks report
    (``RankReport.step_work``) overrides ``work``.
    """
    work = {**work, **ranks[0].step_work, **_per_reference(work, ranks)}
    names = [n for n in names if registry.get(n).source != "steps" or n in work]
    skipped = {i for r in ranks for i in r.skipped_steps}
    slowest = [max(times) for times in zip(*(r.step_times_s for r in ranks), strict=True)]
    per_step = [t for i, t in enumerate(slowest) if i not in skipped]
    rates = {name: [w / t for t in per_step] for name, w in work.items()}
    values = _values(names, rates, lambda m: _reduce(m.across_ranks, [_reported(r, m.name) for r in ranks]))
    return ScenarioMetrics(
        values=values,
        step_time_median_s=statistics.median(per_step),
        step_time_p90_s=percentile(per_step, 90),
        step_times_s=per_step,
        per_rank=[_rank_row(r, work, names, skipped) for r in ranks],
        steady_state_start=ranks[0].steady_state_start,
        warmup_times_s=list(ranks[0].warmup_times_s),
        health=[{"rank": r.rank, **r.health} for r in ranks],
        skipped_steps=len(skipped),
        step_work=work,
        detail=ranks[0].detail,
        contention=measure_contention([{"rank": r.rank, **r.health} for r in ranks]),
    )


def _per_reference(work: Mapping[str, float], ranks: Sequence[RankReport]) -> dict[str, float]:
    """Work behind ``samples_per_ref``: samples per step times the launch's mean
    reference time, so each step's rate is samples per reference-time (none
    without reference times)."""
    refs = [t for r in ranks for t in r.reference_times_s]
    if not refs or "samples_per_s" not in work:
        return {}
    return {"samples_per_ref": work["samples_per_s"] * statistics.fmean(refs)}


def pool(runs: Sequence[ScenarioMetrics], names: Sequence[str]) -> ScenarioMetrics:
    """Metrics of several launches of one scenario: step samples pooled (each
    at its launch's own work per step), other metrics combined by their
    entry's ``across_launches``, and each launch's values kept under ``repeats``."""
    per_step = [t for run in runs for t in run.step_times_s]
    rates = {name: [run.step_work[name] / t for run in runs for t in run.step_times_s] for name in runs[0].step_work}
    names = [n for n in names if registry.get(n).source != "steps" or n in rates]
    # Each launch's own number (not value()), so exact counts stay ints.
    values = _values(names, rates, lambda m: _reduce(m.across_launches, [_number(run, m.name) for run in runs]))
    first = runs[0]
    return ScenarioMetrics(
        values=values,
        step_time_median_s=statistics.median(per_step),
        step_time_p90_s=percentile(per_step, 90),
        step_times_s=per_step,
        per_rank=first.per_rank,
        steady_state_start=first.steady_state_start,
        warmup_times_s=first.warmup_times_s,
        health=first.health,
        repeats=[run.repeat_summary() for run in runs],
        skipped_steps=sum(run.skipped_steps for run in runs),
        step_work=first.step_work,
        detail=first.detail,
        detail_varies=tuple(
            sorted(k for k in first.detail if any(run.detail.get(k) != first.detail[k] for run in runs))
        ),
        contention=_worst(run.contention for run in runs),
    )


def _worst(found: Iterable[Contention | None]) -> Contention | None:
    worst: Contention | None = None
    for c in found:
        worst = c.worse(worst) if c is not None else worst
    return worst


def _values(
    names: Sequence[str], rates: Mapping[str, Sequence[float]], combine: Callable[[registry.Metric], float]
) -> dict[str, Value]:
    """``steps`` metrics from their per-step ``rates``; the others by ``combine``."""
    values: dict[str, Value] = {}
    for name in names:
        metric = registry.get(name)
        values[name] = _rate(metric, rates[name]) if metric.source == "steps" else combine(metric)
    return values


def _rate(metric: registry.Metric, rates: Sequence[float]) -> Value:
    samples = Summary.of(rates)
    return samples if metric.spread else samples.mean


def _reduce(how: str, values: Sequence[float]) -> float:
    if how == "max":
        return max(values)
    if how == "min":
        return min(values)
    if how == "sum":
        return sum(values)
    return statistics.fmean(values)


def _number(metrics: ScenarioMetrics, name: str) -> float:
    value = metrics.values[name]
    return value.mean if isinstance(value, Summary) else value


def _reported(report: RankReport, name: str) -> float:
    if name not in report.metrics:
        raise ValueError(
            f"rank {report.rank} reported no value for metric {name!r} (it reported {sorted(report.metrics)}): "
            "the workload's runner must measure every metric its kind declares"
        )
    return report.metrics[name]


def _rank_row(report: RankReport, work: Mapping[str, float], names: Sequence[str], skipped: set[int]) -> dict[str, Any]:
    mean_step = statistics.fmean(t for i, t in enumerate(report.step_times_s) if i not in skipped)
    row: dict[str, Any] = {"rank": report.rank, "host": report.host}
    for name in names:
        steps = registry.get(name).source == "steps"
        row[name] = work[name] / mean_step if steps else _reported(report, name)
    return {**row, "memory": dict(report.memory), "model_state": dict(report.model_state)}
