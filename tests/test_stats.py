from __future__ import annotations

import pytest

from perfsuite.stats import Summary, aggregate, percentile


def rank(r: int, times: list[float], peak: float, state: int) -> dict:
    return {"rank": r, "step_times_s": times, "peak_mem_mib": peak, "model_state": {"total": state}}


def test_step_time_is_slowest_rank_and_memory_worst_rank() -> None:
    m = aggregate([rank(0, [1.0, 2.0], 100, 10), rank(1, [2.0, 1.0], 300, 30)], global_batch=8, seq_len=4)
    assert m.step_times_s == [2.0, 2.0]
    assert m.samples_per_s == Summary(4.0, 0.0, 2)
    assert m.tokens_per_s == 16.0
    assert m.peak_mem_mib == 300 and m.model_state_bytes_per_rank == 30
    assert [r["rank"] for r in m.per_rank] == [0, 1]


def test_summary_and_percentiles() -> None:
    s = Summary.of([1.0, 2.0, 3.0])
    assert (s.mean, s.n) == (2.0, 3) and s.std == pytest.approx(1.0)
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    assert percentile([5.0], 50) == 5.0


def test_empty_sample_is_an_error() -> None:
    with pytest.raises(ValueError):
        Summary.of([])
