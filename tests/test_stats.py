from __future__ import annotations

import pytest

from perfsuite.core.protocol import RankReport
from perfsuite.judge.stats import ScenarioMetrics, Summary, aggregate, percentile, pool

NAMES = ("samples_per_s", "tokens_per_s", "peak_mem_mib", "model_state_bytes_per_rank")
WORK = {"samples_per_s": 8, "tokens_per_s": 32}


def rank(r: int, times: list[float], peak: float, state: int) -> RankReport:
    return RankReport(
        rank=r,
        status="ok",
        step_times_s=tuple(times),
        metrics={"peak_mem_mib": peak, "model_state_bytes_per_rank": state},
    )


def test_step_time_is_slowest_rank_and_memory_worst_rank() -> None:
    m = aggregate([rank(0, [1.0, 2.0], 100, 10), rank(1, [2.0, 1.0], 300, 30)], WORK, NAMES)
    assert m.step_times_s == [2.0, 2.0]
    assert m.summary("samples_per_s") == Summary(4.0, 0.0, 2)
    assert m.values["tokens_per_s"] == 16.0  # no spread kept: a number, as the results file has it
    assert m.value("peak_mem_mib") == 300 and m.value("model_state_bytes_per_rank") == 30
    assert [(r["rank"], r["samples_per_s"], r["peak_mem_mib"]) for r in m.per_rank] == [
        (0, 16 / 3, 100),
        (1, 16 / 3, 300),
    ]


def test_launches_pool_steps_and_reduce_rank_metrics_by_their_entry() -> None:
    first = aggregate([rank(0, [1.0, 1.0], 100, 10), rank(1, [1.0, 1.0], 100, 10)], WORK, NAMES)
    second = aggregate([rank(0, [2.0, 2.0], 250, 10), rank(1, [2.0, 2.0], 90, 10)], WORK, NAMES)
    pooled = pool([first, second], NAMES)
    assert pooled.summary("samples_per_s") is not None and pooled.summary("samples_per_s").n == 4
    assert pooled.value("samples_per_s") == 6.0 and pooled.value("peak_mem_mib") == 250
    # Exact counts stay ints through pooling, as the results file reports them.
    assert pooled.values["model_state_bytes_per_rank"] == 10 and isinstance(
        pooled.values["model_state_bytes_per_rank"], int
    )
    assert [r["samples_per_s"] for r in pooled.repeats] == [8.0, 4.0]


def test_a_declared_metric_no_rank_reported_is_an_error() -> None:
    with pytest.raises(ValueError, match="rank 0 reported no value for metric 'peak_mem_mib'"):
        aggregate([RankReport(rank=0, status="ok", step_times_s=(1.0,))], WORK, NAMES)


def test_summary_and_percentiles() -> None:
    s = Summary.of([1.0, 2.0, 3.0])
    assert (s.mean, s.n) == (2.0, 3) and s.std == pytest.approx(1.0)
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    assert percentile([5.0], 50) == 5.0


def test_empty_sample_is_an_error() -> None:
    with pytest.raises(ValueError):
        Summary.of([])


def test_skipped_updates_leave_the_rates_and_are_counted() -> None:
    # Rank 1 skipped measured step 1 (an fp16 overflow): a fast step that trained nothing.
    ranks = [rank(0, [1.0, 0.1, 1.0], 100, 10), rank(1, [1.0, 0.1, 2.0], 100, 10)]
    ranks[1] = RankReport(**{**ranks[1].__dict__, "skipped_steps": (1,)})
    m = aggregate(ranks, WORK, NAMES)
    assert m.skipped_steps == 1 and m.step_times_s == [1.0, 2.0]
    assert m.summary("samples_per_s") == Summary.of([8.0, 4.0])
    assert [r["samples_per_s"] for r in m.per_rank] == [8.0, 8 / 1.5]
    assert pool([m, m], NAMES).skipped_steps == 2 and m.to_json()["skipped_steps"] == 1


def test_work_reported_by_the_ranks_overrides_the_scenario_and_pools_per_launch() -> None:
    # A best-shape search decides its work per step on the ranks; two launches
    # may pick different shapes, so each launch's rates use its own work.
    def launch(work: float) -> ScenarioMetrics:
        report = RankReport(
            rank=0,
            status="ok",
            step_times_s=(1.0, 1.0),
            step_work={"samples_per_s": work},
            metrics={"peak_mem_mib": 1.0},
            detail={"shape": work},
        )
        return aggregate([report], {"samples_per_s": 1.0}, ["samples_per_s", "peak_mem_mib"])

    first, second = launch(10.0), launch(30.0)
    assert first.value("samples_per_s") == 10.0 and first.to_json()["detail"] == {"shape": 10.0}
    assert pool([first, second], ["samples_per_s", "peak_mem_mib"]).summary("samples_per_s") == Summary.of(
        [10.0, 10.0, 30.0, 30.0]
    )
