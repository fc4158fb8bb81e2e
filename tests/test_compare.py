"""Comparing measurements: a run's metrics against its baseline (:mod:`perfsuite.judge.compare`),
and two results files side by side (``python -m perfsuite compare``, :mod:`perfsuite.commands.compare`),
on a committed results file as OLD and a doctored copy of it as NEW."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import ttest_ind_from_stats

from perfsuite.__main__ import main
from perfsuite.judge.compare import (
    MetricCheck,
    check_metric,
    judge_metrics,
    judge_outcome,
    resolve_tolerances,
    welch_interval,
    worse_p_value,
)
from perfsuite.judge.stats import ScenarioMetrics, Summary
from perfsuite.store.baselines import BaselineEntry


def metrics(throughput: float, peak: float, state: int = 1000) -> ScenarioMetrics:
    values: dict[str, Summary | float] = {
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


# ``python -m perfsuite compare OLD NEW``

RUNS = Path(__file__).parents[1] / "docs" / "gpu-runs"
H100 = RUNS / "2026-11-26-nvidia-h100-x1" / "results.json"
H200 = RUNS / "2026-11-26-nvidia-h200-x1" / "results.json"
ROW = "mixed_precision.amp"  # headline samples_per_s: 406.7 +/- 7.6 over 60 steps on the H100


def doctored(tmp_path: Path, change: Callable[[dict[str, Any]], None] | None = None, name: str = "new") -> Path:
    """A copy of the H100 run's results file, changed by ``change``."""
    document = json.loads(H100.read_text())
    if change is not None:
        change(document)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def result(document: dict[str, Any], scenario: str) -> dict[str, Any]:
    return next(r for r in document["results"] if r["id"] == scenario)


def slower(factor: float, scenario: str = ROW) -> Callable[[dict[str, Any]], None]:
    """Scale a row's headline throughput (mean and spread) by ``factor``: 0.8 is a 20% drop."""

    def change(document: dict[str, Any]) -> None:
        found = result(document, scenario)
        headline = found["metrics"][found["config"]["primary"]]
        headline["mean"] *= factor
        headline["std"] *= factor

    return change


def compare(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, list[str], str]:
    code = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def line_of(lines: list[str], scenario: str) -> list[str]:
    return next(line.split() for line in lines if line.startswith(f"{scenario} "))


def test_compare_a_file_with_itself_shows_every_row_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, err = compare(capsys, H100, doctored(tmp_path))
    assert code == 0 and not err
    assert lines[1] == "same profile and machine"
    assert lines[2].split() == [
        "scenario",
        "headline",
        "OLD",
        "NEW",
        "change",
        "95%",
        "interval",
        "peak",
        "MiB",
        "peak",
        "change",
        "note",
    ]
    assert line_of(lines, ROW) == [
        ROW,
        "samples_per_s",
        "407",
        "407",
        "+0.0%",
        "-0.7%",
        "..",
        "+0.7%",
        "7507",
        "->",
        "7507",
        "+0.0%",
    ]
    assert lines[-1] == "12 scenario(s): 12 compared"


def test_fail_on_fails_a_planted_20_percent_slowdown_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = doctored(tmp_path, slower(0.8))
    code, lines, _ = compare(capsys, H100, slow, "--fail-on", "10")
    assert code == 1
    row = line_of(lines, ROW)
    assert row[4] == "-20.0%" and float(row[7].rstrip("%")) < 0  # the whole interval below 0
    assert row[-5:] == ["worse", "by", "more", "than", "10%"]
    assert lines[-1] == f"12 scenario(s): 12 compared; --fail-on 10%: 1 worse by more than 10%: {ROW}"
    assert compare(capsys, H100, slow, "--fail-on", "25%")[0] == 0  # -20% is within 25%
    assert compare(capsys, H100, slow)[0] == 0  # no --fail-on: a report, never a gate
    code, lines, _ = compare(capsys, H100, doctored(tmp_path), "--fail-on", "10")
    assert code == 0 and lines[-1].endswith("--fail-on 10%: none worse")


def test_fail_on_reads_the_headline_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A faster NEW never fails, nor does peak memory (the A/B and the gate judge memory)."""

    def hungrier(document: dict[str, Any]) -> None:
        result(document, ROW)["metrics"]["peak_mem_mib"] *= 2

    assert compare(capsys, H100, doctored(tmp_path, slower(1.5)), "--fail-on", "0")[0] == 0
    code, lines, _ = compare(capsys, H100, doctored(tmp_path, hungrier), "--fail-on", "0")
    assert code == 0 and line_of(lines, ROW)[8:12] == ["7507", "->", "15014", "+100.0%"]


def test_markdown_for_a_job_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = doctored(tmp_path, slower(0.8))
    code, lines, _ = compare(capsys, H100, slow, "--markdown", "--fail-on", "10")
    assert code == 1
    assert lines[:3] == [f"## perfsuite compare: `{H100}` -> `{slow}`", "", "Same profile and machine."]
    assert lines[4] == "| scenario | headline | OLD | NEW | change | 95% interval | peak MiB | peak change | note |"
    assert lines[5] == "|" + "---|" * 9
    row = next(line for line in lines if line.startswith(f"| `{ROW}` |"))
    assert row.startswith(f"| `{ROW}` | samples_per_s | 407 | 325 | -20.0% | ")
    assert row.endswith(" | 7507 -> 7507 | +0.0% | worse by more than 10% |")
    assert lines[-1].endswith(f"--fail-on 10%: 1 worse by more than 10%: {ROW}")


def test_rows_in_one_file_and_rows_not_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def reshuffle(document: dict[str, Any]) -> None:
        document["results"] = [r for r in document["results"] if r["id"] != "parallel_3d.tp1_pp1"]
        result(document, "microbench.device_copy")["id"] = "microbench.device_copy_v2"
        result(document, ROW).update(status="oom", verdict="unexpected_oom")

    code, lines, _ = compare(capsys, H100, doctored(tmp_path, reshuffle), "--fail-on", "1")
    assert code == 0  # nothing compared got slower; what was not compared is listed, not failed
    assert line_of(lines, "parallel_3d.tp1_pp1")[-3:] == ["only", "in", "OLD"]
    assert line_of(lines, "microbench.device_copy")[-3:] == ["only", "in", "OLD"]
    assert line_of(lines, "microbench.device_copy_v2")[-3:] == ["only", "in", "NEW"]
    assert lines[-2].startswith("microbench.device_copy_v2 ")  # NEW's own rows come last
    assert line_of(lines, ROW)[-4:] == ["not", "measured:", "NEW", "oom"]
    tally = "13 scenario(s): 9 compared, 2 only in OLD, 1 not measured, 1 only in NEW"
    assert lines[-1] == f"{tally}; --fail-on 1%: none worse"


def test_machines_and_profiles_that_differ_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def capped(document: dict[str, Any]) -> None:
        document["machine"]["gpus"][0]["power_limit_w"] = 700

    def elsewhere(document: dict[str, Any]) -> None:
        document["profile"] = "nvidia-h100-nightly"
        machine = document["machine"]
        machine["gpus"][0].update(uuid="GPU-5f3c", power_limit_w=500)
        machine["processor"] = {
            "vendor": "AuthenticAMD",
            "model": "AMD EPYC 9654",
            "family": 25,
            "model_number": 17,
            "stepping": 1,
            "cores": 16,
            "features": ["avx512f"],
        }
        machine["packages"]["torch"] = "2.12.0"

    code, lines, _ = compare(capsys, doctored(tmp_path, capped, "old"), doctored(tmp_path, elsewhere))
    assert code == 0
    assert lines[1:7] == [
        "OLD and NEW differ in:",
        "  profile: nvidia-h100-80gb-hbm3-x1 -> nvidia-h100-nightly",
        "  GPUs: GPU 0 NVIDIA H100 80GB HBM3 -> GPU 0 NVIDIA H100 80GB HBM3 GPU-5f3c",
        "  processor: x86_64 -> AMD EPYC 9654 (AuthenticAMD 25/17/1, 16 cores; avx512f)",
        "  GPU 0 power_limit_w 700 -> 500",
        "  packages: torch 2.11.0 -> 2.12.0",
    ]


def test_two_committed_runs_on_two_cards(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = compare(capsys, H100, H200, "--fail-on", "5")
    assert code == 0  # the H200 is at most 2.8% slower on any row
    assert lines[2:4] == [
        "  profile: nvidia-h100-80gb-hbm3-x1 -> nvidia-h200-x1",
        "  GPUs: GPU 0 NVIDIA H100 80GB HBM3 -> GPU 0 NVIDIA H200",
    ]
    assert line_of(lines, "microbench.bert_layer_fwd")[-3:] == ["only", "in", "OLD"]
    assert line_of(lines, "microbench.device_copy")[2:8] == ["2993", "4216", "+40.9%", "+40.8%", "..", "+41.0%"]
    assert compare(capsys, H100, H200, "--fail-on", "2")[0] == 1  # matmul_best_fp16: -2.8%


def test_keyword_picks_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = compare(capsys, H100, H200, "-k", "matmul")
    assert code == 0 and lines[-1] == "4 scenario(s): 4 compared"
    code, lines, err = compare(capsys, H100, H200, "-k", "nothing-like-it")
    assert code == 2 and not lines and err.count("\n") == 1 and "matches no scenario" in err


def test_welch_interval_is_scipys() -> None:
    """The interval from mean, std and n is the one scipy's Welch test gives on the samples."""
    from scipy.stats import ttest_ind

    old = [100.0, 102.0, 98.5, 101.0, 99.0, 100.5]
    new = [95.0, 97.5, 90.0, 99.0, 94.0, 96.5, 93.0, 92.0]
    found = welch_interval(Summary.of(old), Summary.of(new), 0.95)
    expected = ttest_ind(new, old, equal_var=False).confidence_interval(0.95)
    assert found == pytest.approx((expected.low, expected.high))
    assert welch_interval(Summary(100.0, 0.0, 1), Summary.of(new), 0.95) is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a perfsuite results file (no 'results' list)"),
        ('{"profile": "cpu", "machine": {}}', "not a perfsuite results file (no 'results' list)"),
        ('{"profile": "cpu", "results": [{"id": "x"}]}', "results[0] lacks 'id', 'status' or 'verdict'"),
        ('{"profile": "cpu", "results": []}', "holds no results"),
    ],
)
@pytest.mark.parametrize("side", ["OLD", "NEW"])
def test_a_bad_file_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, expected: str, side: str
) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    code, lines, err = compare(capsys, *((bad, H100) if side == "OLD" else (H100, bad)))
    assert code == 2 and not lines
    assert err.startswith(f"perfsuite compare: {bad}: ") and expected in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail-on", "ten"], "argument --fail-on: 'ten' is not a percentage; give e.g. 10 for 10%"),
        (["--fail-on", "-5"], "argument --fail-on: must be a percentage of 0 or more, got '-5'"),
        (["--fail-on", "nan"], "argument --fail-on: must be a percentage of 0 or more, got 'nan'"),
        (["--bogus"], "compare: unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_are_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["compare", str(H100), str(H200), *args])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and err.startswith("usage: perfsuite")


COUNT = {"ops": {"aten::mm(float)": 12.0, "aten::item(float)": 2.0}, "collectives": {}, "collective_bytes": 0.0}


def counted(document: dict[str, Any], ops: dict[str, float] | None = None) -> None:
    """Give every row the same step work, ``ops`` changing ROW's."""
    for row in document["results"]:
        row["work"] = {"count": {**COUNT, "ops": {**COUNT["ops"], **(ops or {})}} if row["id"] == ROW else COUNT}


def test_a_change_in_step_work_is_named_first_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = doctored(tmp_path, counted, "old")
    _, lines, _ = compare(capsys, old, doctored(tmp_path, lambda d: counted(d, {"aten::item(float)": 3.0})))
    assert lines[1:3] == [
        "step work changed (exact):",
        f"  {ROW}: host syncs aten::item(float): 3 per step, was 2; op calls: 15 per step, was 14; "
        "op calls per step: aten::item(float) +1",
    ]
    _, same, _ = compare(capsys, old, doctored(tmp_path, counted))
    assert same[1] == "same profile and machine"  # nothing changed: no work lines


@given(
    st.floats(1, 1e4),
    st.floats(0, 1e3),
    st.integers(2, 60),
    st.floats(1, 1e4),
    st.floats(0, 1e3),
    st.integers(2, 60),
    st.sampled_from(["higher", "lower"]),
)
def test_the_gates_welch_test_is_scipys(
    mean: float, std: float, n: int, base_mean: float, base_std: float, base_n: int, direction: str
) -> None:
    """worse_p_value is scipy.stats' one-sided Welch test from the stored statistics, zero spreads
    included (it avoids scipy.stats' import, not its result)."""
    alternative = "less" if direction == "higher" else "greater"
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = float(
            ttest_ind_from_stats(
                mean, std, n, base_mean, base_std, base_n, equal_var=False, alternative=alternative
            ).pvalue
        )
    found = worse_p_value(Summary(mean, std, n), {"mean": base_mean, "std": base_std, "n": base_n}, direction)
    if not np.isfinite(expected):
        assert found is None
    else:
        assert found == pytest.approx(expected, rel=1e-9, abs=1e-12)
