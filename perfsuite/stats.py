"""Summary statistics and the aggregation of per-rank raw measurements.

Workers return raw step times; everything derived (throughput, percentiles,
memory maxima) is computed here, in one place, so the results file, the summary
table and the verdict agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any


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
    """Metrics of one successful run, as the results file contract names them."""

    samples_per_s: Summary
    tokens_per_s: float
    step_time_median_s: float
    step_time_p90_s: float
    peak_mem_mib: float
    model_state_bytes_per_rank: int
    per_rank: list[dict[str, Any]]
    step_times_s: list[float]
    steady_state_start: int = 0  # warmup steps run before measuring (first repeat)
    health: list[dict[str, Any]] = field(default_factory=list)  # per rank, first repeat
    repeats: list[dict[str, Any]] = field(default_factory=list)  # one summary per launch

    def imbalance(self, name: str) -> float:
        """max / min across ranks of a per-rank figure (1.0 = balanced)."""
        values = [float(rank[name]) for rank in self.per_rank]
        return max(values) / min(values) if values and min(values) > 0 else 1.0

    def metric(self, name: str) -> float:
        """Scalar value of a gated metric, as compared with a baseline."""
        if name == "samples_per_s":
            return self.samples_per_s.mean
        return float(getattr(self, name))

    def to_json(self) -> dict[str, Any]:
        return {
            "samples_per_s": asdict(self.samples_per_s),
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": {"median": self.step_time_median_s, "p90": self.step_time_p90_s},
            "peak_mem_mib": self.peak_mem_mib,
            "model_state_bytes_per_rank": self.model_state_bytes_per_rank,
            "per_rank": self.per_rank,
            "step_times_s": self.step_times_s,
            "steady_state_start": self.steady_state_start,
            "health": self.health,
            "repeats": self.repeats,
        }

    def repeat_summary(self) -> dict[str, Any]:
        return {
            "samples_per_s": self.samples_per_s.mean,
            "samples_per_s_std": self.samples_per_s.std,
            "peak_mem_mib": self.peak_mem_mib,
            "steady_state_start": self.steady_state_start,
        }


def aggregate(
    ranks: Sequence[Mapping[str, Any]], global_batch: int, seq_len: int
) -> ScenarioMetrics:
    """Combine per-rank worker reports into scenario metrics.

    A synchronous training step is as slow as its slowest rank, so the step time
    of step *i* is the max over ranks; memory is reported for the worst rank.
    """
    per_step = [max(times) for times in zip(*(r["step_times_s"] for r in ranks), strict=True)]
    metrics = _from_steps(per_step, global_batch, seq_len)
    return replace(
        metrics,
        peak_mem_mib=max(r["peak_mem_mib"] for r in ranks),
        model_state_bytes_per_rank=max(r["model_state"]["total"] for r in ranks),
        per_rank=[_rank_row(r, global_batch) for r in ranks],
        steady_state_start=int(ranks[0].get("steady_state_start", 0)),
        health=[{"rank": r["rank"], **r.get("health", {})} for r in ranks],
    )


def pool(runs: Sequence[ScenarioMetrics], global_batch: int, seq_len: int) -> ScenarioMetrics:
    """Metrics of several launches of one scenario: step samples pooled, memory
    the worst launch's, and one summary per launch under ``repeats``."""
    first = runs[0]
    pooled = _from_steps([t for run in runs for t in run.step_times_s], global_batch, seq_len)
    return replace(
        first,
        samples_per_s=pooled.samples_per_s,
        tokens_per_s=pooled.tokens_per_s,
        step_time_median_s=pooled.step_time_median_s,
        step_time_p90_s=pooled.step_time_p90_s,
        step_times_s=pooled.step_times_s,
        peak_mem_mib=max(run.peak_mem_mib for run in runs),
        model_state_bytes_per_rank=max(run.model_state_bytes_per_rank for run in runs),
        repeats=[run.repeat_summary() for run in runs],
    )


def _from_steps(per_step: list[float], global_batch: int, seq_len: int) -> ScenarioMetrics:
    samples = Summary.of([global_batch / t for t in per_step])
    return ScenarioMetrics(
        samples_per_s=samples,
        tokens_per_s=samples.mean * seq_len,
        step_time_median_s=statistics.median(per_step),
        step_time_p90_s=percentile(per_step, 90),
        peak_mem_mib=0.0,
        model_state_bytes_per_rank=0,
        per_rank=[],
        step_times_s=per_step,
    )


def _rank_row(report: Mapping[str, Any], global_batch: int) -> dict[str, Any]:
    times = report["step_times_s"]
    return {
        "rank": report["rank"],
        "host": report.get("host", ""),
        "samples_per_s": global_batch / statistics.fmean(times),
        "peak_mem_mib": report["peak_mem_mib"],
        "memory": report.get("memory", {}),
        "model_state": report["model_state"],
    }
