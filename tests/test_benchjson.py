"""pytest-benchmark export: a real run writes its format and storage layout (and
a history entry), and pytest-benchmark's own CLI compares perfsuite files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import CPU_PROFILE, TINY_SHAPE, bench_module

from perfsuite.reports.exports import benchjson
from perfsuite.reports.exports.history import load, series
from perfsuite.store.vcs import Commit

PB_UTILS = pytest.importorskip(
    "pytest_benchmark.utils", reason="needs pytest-benchmark: pip install 'pytest-benchmark[histogram]>=4'"
)

ONE = f'Scenario("tiny", "fp32", TINY, {TINY_SHAPE}),'


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def compare(storage: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest-benchmark's own CLI (the ``pytest-benchmark`` console script's module)."""
    cmd = [sys.executable, "-m", "pytest_benchmark", "--storage", f"file://{storage}", "compare", *args]
    return subprocess.run(cmd, cwd=storage, capture_output=True, text=True, check=False)


def test_a_real_run_writes_pytest_benchmark_json_storage_and_history(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(ONE))
    try:
        git(project.path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs git to record the commit: apt-get install git")
    git(project.path, "add", "-A")
    git(project.path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny scenario")
    head = git(project.path, "rev-parse", "HEAD")
    args = ["--perf-json=r.json", "--perf-benchmark-json=bench.json", "--perf-benchmark-save=first"]
    result = project.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, *args, "--perf-history=hist")
    result.assert_outcomes(skipped=1)  # no baseline: measured, not judged
    result.stdout.fnmatch_lines(["perfsuite history: recorded *hist/cpu/*.json"])

    (measured,) = json.loads((project.path / "r.json").read_text())["results"]
    steps = measured["metrics"]["step_times_s"]
    doc = json.loads((project.path / "bench.json").read_text())
    assert doc["commit_info"]["id"] == head and doc["commit_info"]["dirty"] is False
    assert doc["machine_info"]["machine"] and doc["machine_info"]["perfsuite"]["profile"] == "cpu"
    (bench,) = doc["benchmarks"]
    assert bench["name"] == "tiny.fp32" and bench["group"] == "tiny"
    stats = bench["stats"]
    assert stats["data"] == steps and stats["rounds"] == len(steps) == 4
    assert stats["ops"] == pytest.approx(len(steps) / sum(steps))  # steps per second
    info = bench["extra_info"]
    assert info["samples_per_s"] == measured["metrics"]["samples_per_s"]["mean"] and info["samples_per_s_std"] > 0
    assert info["tokens_per_s"] > 0 and info["peak_mem_mib"] > 0 and info["model_state_bytes_per_rank"] > 0
    assert info["verdict"] == measured["verdict"] and info["profile"] == "cpu" and info["world_size"] == 2

    saved = project.path / ".benchmarks" / PB_UTILS.get_machine_id() / "0001_first.json"
    assert json.loads(saved.read_text())["benchmarks"][0]["stats"]["data"] == steps
    listed = compare(project.path / ".benchmarks", str(saved))
    assert listed.returncode == 0, listed.stderr
    assert "tiny.fp32" in listed.stdout

    (run,) = load(project.path / "hist", "cpu")
    assert run.commit == head and run.path.name.endswith(f"_{head[:7]}.json") and not run.dirty
    (point,) = series([run], "tiny.fp32", "samples_per_s")
    assert point.value == info["samples_per_s"] and point.commit == head


def results(samples_per_s: float) -> dict[str, Any]:
    """A results document with two measured scenarios (16 samples a step) and a skipped one."""

    def result(name: str, rate: float, status: str = "ok") -> dict[str, Any]:
        steps = [16 / rate * f for f in (0.97, 1.0, 1.02, 0.99, 1.03, 1.0)]
        metrics = {
            "samples_per_s": {"mean": rate, "std": rate * 0.02, "n": len(steps)},
            "tokens_per_s": rate * 32,
            "peak_mem_mib": 512.0,
            "model_state_bytes_per_rank": 2**20,
            "step_times_s": steps,
            "steady_state_start": 1,
        }
        return {
            "id": f"tiny.{name}",
            "group": "tiny",
            "status": status,
            "config": {"world_size": 2},
            "metrics": metrics if status == "ok" else {},
            "verdict": "pass" if status == "ok" else "skipped",
        }

    rows = [result("fp32", samples_per_s), result("bf16", samples_per_s * 1.5), result("fp16", 1, "skipped")]
    return {"machine": {"hostname": "ci"}, "profile": "cpu", "results": rows}


def test_pytest_benchmark_compare_lists_the_scenarios_of_two_perfsuite_files(tmp_path: Path) -> None:
    storage = tmp_path / ".benchmarks"
    commit = Commit(id="ab" * 20, time="2026-01-05T09:00:00+00:00", dirty=True)
    first = benchjson.save_in_storage(storage, benchjson.benchmark_document(results(100.0), commit, "p"), "base")
    second = benchjson.save_in_storage(storage, benchjson.benchmark_document(results(80.0), commit, "p"), "slow")
    assert (first.name, second.name) == ("0001_base.json", "0002_slow.json")
    assert first.parent.name == PB_UTILS.get_machine_id()
    assert [b["name"] for b in json.loads(first.read_text())["benchmarks"]] == ["tiny.fp32", "tiny.bf16"]

    listed = compare(storage, str(first), str(second))
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith("tiny.")]
    assert sorted(row.split()[0] for row in rows) == ["tiny.bf16", "tiny.bf16", "tiny.fp32", "tiny.fp32"]
    assert "0001_base" in listed.stdout and "0002_slow" in listed.stdout

    pytest.importorskip("pygal", reason="histograms need pygal: pip install 'pytest-benchmark[histogram]>=4'")
    drawn = compare(storage, "--histogram", str(tmp_path / "hist"), str(first), str(second))
    assert drawn.returncode == 0, drawn.stderr
    svg = tmp_path / "hist-tiny.svg"  # one chart per group
    assert svg.read_text().lstrip().startswith("<?xml") and "tiny.fp32" in svg.read_text()


def test_the_autosave_name_is_pytest_benchmarks_tag() -> None:
    name = benchjson.tag(Commit(id="ab" * 20, dirty=True))
    head, day, time, mark = name.rsplit("_", 3)
    assert head == "ab" * 20 and len(day) == 8 and len(time) == 6 and mark == "uncommitted-changes"
    assert benchjson.tag(Commit()).startswith("unversioned_")


class Options:
    """The few Config members pytest_configure reads."""

    def __init__(self, **given: Any) -> None:
        self.given = {f"--perf-benchmark-{k}": v for k, v in given.items()}

    def getoption(self, name: str) -> Any:
        return self.given.get(name)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"save": "a/b"}, "--perf-benchmark-save='a/b': Must not contain"),
        ({"storage": "s"}, "--perf-benchmark-storage is where"),
        ({"json": "."}, "--perf-benchmark-json must name a file"),
    ],
)
def test_bad_flags_are_usage_errors(given: dict[str, Any], message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message.replace("[", r"\[").replace(".", r"\.")):
        benchjson.pytest_configure(Options(**given))  # type: ignore[arg-type]


def test_without_pytest_benchmark_the_flag_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytest_benchmark.utils", None)  # import fails as if not installed
    with pytest.raises(pytest.UsageError, match=r"--perf-benchmark-json needs pytest-benchmark: pip install"):
        benchjson.pytest_configure(Options(json="out.json"))  # type: ignore[arg-type]
    benchjson.pytest_configure(Options())  # type: ignore[arg-type]  # no flag, no import
