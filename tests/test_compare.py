from __future__ import annotations

import pytest

from perfsuite.judge.compare import (
    MetricCheck,
    check_metric,
    judge_metrics,
    judge_outcome,
    resolve_tolerances,
)
from perfsuite.judge.stats import ScenarioMetrics, Summary
from perfsuite.store.baselines import BaselineEntry


def metrics(throughput: float, peak: float, state: int = 1000) -> ScenarioMetrics:
    values = {
        "samples_per_s": Summary(throughput, 1.0, 10),
        "tokens_per_s": throughput * 16,
        "peak_mem_mib": peak,
        "model_state_bytes_per_rank": state,
    }
    return ScenarioMetrics(values, step_time_median_s=0.1, step_time_p90_s=0.12, step_times_s=[])


def entry(throughput: float, peak: float, tolerances: dict[str, float] | None = None) -> BaselineEntry:
    return BaselineEntry(
        expected="ok",
        metrics={"samples_per_s": {"mean": throughput, "std": 1.0, "n": 10}, "peak_mem_mib": peak},
        tolerances=tolerances or {},
        fingerprint={},
    )


TOL = {"samples_per_s": 0.10, "peak_mem_mib": 0.05}


@pytest.mark.parametrize(
    ("throughput", "peak", "verdict"),
    [
        (100, 1000, "pass"),
        (91, 1000, "pass"),  # -9% within 10%
        (85, 1000, "regression"),  # throughput dropped
        (100, 1100, "regression"),  # memory grew
        (120, 1000, "improved"),  # faster beyond tolerance: stale baseline
        (100, 900, "improved"),  # smaller beyond tolerance
    ],
)
def test_direction_aware_verdicts(throughput: float, peak: float, verdict: str) -> None:
    assert judge_metrics(metrics(throughput, peak), entry(100, 1000), TOL).verdict == verdict


def test_regression_message_names_metric_and_delta() -> None:
    judgement = judge_metrics(metrics(50, 1000), entry(100, 1000), TOL)
    assert "samples_per_s" in judgement.message and "-50.0%" in judgement.message


@pytest.mark.parametrize(
    ("status", "expected", "verdict"),
    [("oom", "oom", "expected_oom"), ("oom", "ok", "unexpected_oom"), ("ok", "oom", "unexpected_pass")],
)
def test_outcome_verdicts(status: str, expected: str, verdict: str) -> None:
    judgement = judge_outcome(status, expected, None)
    assert judgement is not None and judgement.verdict == verdict


def test_unexpected_pass_says_to_update() -> None:
    judgement = judge_outcome("ok", "oom", None)
    assert judgement is not None and "--perf-update-baselines" in judgement.message


def test_missing_baseline_and_ok_run() -> None:
    judgement = judge_outcome("ok", "ok", None)
    assert judgement is not None and judgement.verdict == "no_baseline"
    assert judge_outcome("ok", "ok", entry(1, 1)) is None


def test_tolerance_precedence() -> None:
    merged = resolve_tolerances({"samples_per_s": 0.4}, {"samples_per_s": 0.2}, entry(1, 1, {"samples_per_s": 0.1}))
    assert merged["samples_per_s"] == 0.1
    assert resolve_tolerances({"samples_per_s": 0.4}, {"samples_per_s": 0.2}, None)["samples_per_s"] == 0.2


def test_check_metric_lower_is_better() -> None:
    check = check_metric(MetricCheck("peak_mem_mib", 110, 100, 0.05, "lower"))
    assert check.outcome == "regression" and check.delta == pytest.approx(0.10)
