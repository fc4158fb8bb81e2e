"""History store, its typed API and change-point detection, on synthetic runs
(the real run that records one is in test_benchjson.py)."""

from __future__ import annotations

import json
import random
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import CPU_PROFILE

from perfsuite.__main__ import main
from perfsuite.reports.exports.changepoint import e_divisive
from perfsuite.reports.exports.history import Point, change_points, load, record, series
from perfsuite.store.vcs import Commit, current_commit

START = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
SCENARIO = "tiny.fp32"


def document(samples_per_s: float, profile: str = "cpu", status: str = "ok") -> dict[str, Any]:
    """A results document as --perf-json writes it, reduced to what history reads."""
    metrics = {
        "samples_per_s": {"mean": samples_per_s, "std": samples_per_s * 0.02, "n": 8},
        "peak_mem_mib": 700.0,
        "model_state.params": 1024,
        "step_time_s": {"median": 16 / samples_per_s, "p90": 17 / samples_per_s},
    }
    results = [
        {"id": SCENARIO, "group": "tiny", "status": status, "metrics": metrics if status == "ok" else {}},
        {"id": "tiny.bf16", "group": "tiny", "status": "skipped", "metrics": {}},
    ]
    return {"machine": {"hostname": "ci"}, "profile": profile, "results": results}


def commit(i: int) -> Commit:
    """The i-th synthetic commit, one hour after the previous one."""
    return Commit(id=f"c{i:03d}" + "0" * 36, time=(START + timedelta(hours=i)).isoformat(), dirty=False)


def plant(directory: Path, values: list[float]) -> None:
    """One recorded run per value, each at its own commit, recorded in a shuffled order."""
    order = list(range(len(values)))
    random.Random(7).shuffle(order)
    for n, i in enumerate(order):
        record(directory, document(values[i]), commit(i), now=START + timedelta(days=3, minutes=n))


def step_history(seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(100, 2) for _ in range(20)] + [rng.gauss(85, 2) for _ in range(20)]


def test_a_planted_step_is_found_at_its_commit(tmp_path: Path) -> None:
    plant(tmp_path, step_history())
    runs = load(tmp_path, "cpu")
    # Sorted by commit time although recorded in another order.
    assert [r.commit[:4] for r in runs if r.commit] == [f"c{i:03d}" for i in range(40)]
    points = series(runs, SCENARIO, "samples_per_s")
    assert len(points) == 40 and points[0].std == pytest.approx(points[0].value * 0.02)
    (change,) = change_points(points)
    assert change.index == 20 and change.commit == commit(20).id
    assert change.before_mean == pytest.approx(100, abs=1.5) and change.after_mean == pytest.approx(85, abs=1.5)
    assert change.rel_change == pytest.approx(-0.15, abs=0.02) and change.p_value <= 0.01


def test_no_step_no_change_point(tmp_path: Path) -> None:
    rng = random.Random(11)
    plant(tmp_path, [rng.gauss(100, 2) for _ in range(40)])
    assert change_points(series(load(tmp_path), SCENARIO, "samples_per_s")) == []


def test_two_steps_and_a_constant_series() -> None:
    rng = random.Random(5)
    values = [rng.gauss(100, 2) for _ in range(15)] + [rng.gauss(80, 2) for _ in range(15)]
    values += [rng.gauss(95, 2) for _ in range(15)]
    assert [s.index for s in e_divisive(values)] == [15, 30]
    assert e_divisive([7.0] * 20) == []
    assert e_divisive([1.0, 2.0, 3.0]) == []  # too short to split
    with pytest.raises(ValueError, match="finite"):
        e_divisive([1.0, float("nan"), 2.0])
    points = [Point(None, START.isoformat(), v, None) for v in values]
    assert [c.index for c in change_points(points)] == [15, 30]


def test_a_reverted_regression_is_found() -> None:
    """A dip that a later commit undoes: the split's statistic takes the best end of
    the part after it (Matteson & James's kappa), else the two halves look alike
    (with kappa fixed at the end, none of these six seeds gave a change point)."""
    for seed in range(6):
        rng = random.Random(seed)
        values = [rng.gauss(100, 2) for _ in range(15)] + [rng.gauss(90, 2) for _ in range(10)]
        values += [rng.gauss(100, 2) for _ in range(15)]
        assert [s.index for s in e_divisive(values)] == [15, 25], seed


def test_series_reads_plain_dotted_and_nested_metrics_and_skips_unmeasured_runs(tmp_path: Path) -> None:
    record(tmp_path, document(50.0), commit(1), now=START)
    record(tmp_path, document(1.0, status="crash"), commit(2), now=START + timedelta(minutes=1))
    runs = load(tmp_path)
    assert [p.value for p in series(runs, SCENARIO, "peak_mem_mib")] == [700.0]
    assert [p.value for p in series(runs, SCENARIO, "model_state.params")] == [1024.0]
    assert [p.value for p in series(runs, SCENARIO, "step_time_s.median")] == [pytest.approx(16 / 50)]
    assert series(runs, SCENARIO, "no_such_metric") == [] and series(runs, "other.id", "samples_per_s") == []


def test_a_run_outside_git_records_no_commit(tmp_path: Path) -> None:
    outside = current_commit(tmp_path)  # tmp_path is no git checkout
    assert outside == Commit() and outside.short is None
    path = record(tmp_path / "h", document(50.0, profile="cuda 32gb"), outside)
    assert path.parent.name == "cuda_32gb" and path.name.endswith("_nocommit.json")
    stored = json.loads(path.read_text())
    assert stored["commit"] is None and stored["dirty"] is False and stored["results"][0]["id"] == SCENARIO
    (run,) = load(tmp_path / "h", "cuda 32gb")
    assert run.commit is None and run.profile == "cuda 32gb" and "recorded_at" not in run.document


def test_history_command_prints_the_series_and_the_shift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plant(tmp_path, step_history())
    assert main(["history", str(tmp_path), "-k", "fp32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{SCENARIO} (cpu): samples_per_s over 40 run(s)")
    assert (
        re.search(r"^c000000   2026-01-05 09:00  +\d+\.?\d* ± ", out, re.M) and " ± " in out and "tiny.bf16" not in out
    )
    assert f"samples_per_s of {SCENARIO} shifted -1" in out and "at commit c020000 (p=0.002)" in out
    assert main(["history", str(tmp_path), "--metric", "peak_mem_mib"]) == 0
    assert "no change point in peak_mem_mib" in capsys.readouterr().out


def plant_upgrade(directory: Path, values: list[float], upgraded_at: int, python_at: int | None = None) -> None:
    """``plant``, each run's fingerprint naming torch 2.12.0 before run ``upgraded_at`` and 2.13.0
    from it (and Python 3.12.1 from run ``python_at``)."""
    for i, value in enumerate(values):
        doc = document(value)
        python = "3.12.1" if python_at is not None and i >= python_at else "3.11.7"
        torch = "2.13.0" if i >= upgraded_at else "2.12.0"
        doc["machine"] = {"python": python, "packages": {"torch": torch, "transformers": "4.57.0"}, "driver": None}
        record(directory, doc, commit(i), now=START + timedelta(days=3, minutes=i))


def test_a_shift_at_a_torch_upgrade_is_labelled_with_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plant_upgrade(tmp_path, step_history(), upgraded_at=20, python_at=20)
    (change,) = change_points(series(load(tmp_path, "cpu"), SCENARIO, "samples_per_s"))
    assert change.index == 20 and change.environment == ("Python 3.11.7 -> 3.12.1", "torch 2.12.0 -> 2.13.0")
    assert main(["history", str(tmp_path), "-k", "fp32"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "shifted" in x)
    assert line.endswith("; the environment changed there: Python 3.11.7 -> 3.12.1, torch 2.12.0 -> 2.13.0")


def test_an_upgrade_away_from_the_shift_labels_nothing(tmp_path: Path) -> None:
    plant_upgrade(tmp_path, step_history(), upgraded_at=10)
    (change,) = change_points(series(load(tmp_path, "cpu"), SCENARIO, "samples_per_s"))
    assert change.index == 20 and change.environment == () and change.label() == ""


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: d.mkdir(), "no history files"),
        (lambda d: (d / "cpu").mkdir(parents=True) or (d / "cpu" / "bad.json").write_text("{oops"), "bad.json"),
        (
            lambda d: (d / "cpu").mkdir(parents=True) or (d / "cpu" / "x.json").write_text('{"results": []}'),
            "'recorded_at' must be an ISO 8601 time",
        ),
    ],
)
def test_history_command_names_a_missing_empty_or_corrupt_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: Any, expected: str
) -> None:
    store = tmp_path / "store"
    setup(store)
    assert main(["history", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfsuite history: ") and expected in err and "Traceback" not in err


def test_history_command_says_when_nothing_has_the_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path, document(50.0), commit(1), now=START)
    assert main(["history", str(tmp_path), "-k", "nope"]) == 2
    assert "no scenario matching -k 'nope'" in capsys.readouterr().err


def test_perf_history_must_be_a_folder(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", notafolder="x")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, "--perf-history=notafolder.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-history must name a folder*notafolder.txt*"])
