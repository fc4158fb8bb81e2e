"""``python -m perfsuite ab-rev REV`` (issue 26, item 6): this checkout against a git revision,
interleaved. The comparison of replayed runs, the export of a revision, and bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perfsuite.commands.abrev import BASE, CANDIDATE, METRIC, compare_runs, export, launch_of, own_plugin

BUSY = "other processes kept 0.90 of vm's 2 CPU cores busy (limit 0.25)"


def runs(base: list[float], candidate: list[float], busy: str = "") -> list[tuple[str, dict]]:
    """Alternating runs of one scenario, base first, as ab-rev makes them."""
    out = []
    for b, c in zip(base, candidate, strict=True):
        out.append((BASE, {"g.s": ("ok", {METRIC: b}, "", "")}))
        out.append((CANDIDATE, {"g.s": ("ok", {METRIC: c}, "", busy)}))
    return out


def test_a_slower_candidate_beside_a_drifting_base_is_a_regression() -> None:
    # The machine drifts +-30% between pairs; the candidate is 20% slower than the base beside it.
    base = [100.0, 70.0, 130.0]
    (result,) = compare_runs(runs(base, [b * 0.8 for b in base]), pairs=3, tolerance=0.10)
    assert result.verdict == "regression"
    assert result.comparisons[0].change == pytest.approx(-0.2)


def test_drift_alone_passes_and_contention_makes_a_regression_unreliable() -> None:
    base = [100.0, 70.0, 130.0]
    (same,) = compare_runs(runs(base, [b * 1.01 for b in base]), pairs=3, tolerance=0.10)
    assert same.verdict == "pass"
    (busy,) = compare_runs(runs(base, [b * 0.8 for b in base], busy=BUSY), pairs=3, tolerance=0.10)
    assert busy.verdict == "unreliable" and "measured under contention" in busy.message


def test_a_scenario_one_side_did_not_measure_is_an_error() -> None:
    measured = runs([100.0, 100.0], [99.0, 98.0])
    measured[1] = (CANDIDATE, {"g.s": ("crash", {}, "rank 1 died", "")})
    (result,) = compare_runs(measured, pairs=2, tolerance=0.10)
    assert result.verdict == "error" and "rank 1 died" in result.message


def test_a_scenario_without_samples_per_s_is_skipped_not_passed() -> None:
    # A matmul measured on both sides has no throughput to compare: never a green "pass".
    matmul = {"id": "microbench.matmul_fp32", "status": "ok", "metrics": {"tflops": {"mean": 0.3, "std": 0.01, "n": 8}}}
    (result,) = compare_runs([(BASE, {"m": launch_of(matmul)}), (CANDIDATE, {"m": launch_of(matmul)})] * 2, 2, 0.10)
    assert result.verdict == "skipped" and f"measures no {METRIC}" in result.message


def test_a_revision_is_exported_without_a_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (repo / "a.txt").write_text("two\n")  # uncommitted: the candidate's, not the base's
    commit = export(repo, "HEAD", tmp_path / "base")
    assert (tmp_path / "base" / "a.txt").read_text() == "one\n" and len(commit) == 40
    assert subprocess.run([*git, "worktree", "list"], capture_output=True, text=True).stdout.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["ab-rev", "no-such-rev", "-k", "x"], "cannot export 'no-such-rev'"),
        (["ab-rev", "HEAD", "-k", "x", "--pairs", "1"], "argument --pairs"),
        (["ab-rev", "HEAD", "-k", "x", "--tolerance", "2"], "argument --tolerance"),
        (["ab-rev", "HEAD", "--pairs", "x"], "is not a whole number"),
    ],
)
def test_bad_input_is_refused_with_exit_2(args: list[str], words: str) -> None:
    done = subprocess.run([sys.executable, "-m", "perfsuite", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and words in done.stderr


def test_a_side_that_holds_perfsuite_loads_its_own_plugin_module(tmp_path: Path) -> None:
    # A revision from before the folders names perfsuite.plugin; the installed entry point names
    # this checkout's perfsuite.plugin.hooks, which that revision's code does not have.
    assert own_plugin(tmp_path) == []  # a team's repository: the installed perfsuite's plugin
    (tmp_path / "perfsuite").mkdir()
    (tmp_path / "perfsuite" / "__init__.py").write_text("")
    assert own_plugin(tmp_path) == []  # no pyproject.toml to say which module
    (tmp_path / "pyproject.toml").write_text('[project.entry-points.pytest11]\nperfsuite = "perfsuite.plugin"\n')
    assert own_plugin(tmp_path) == ["-p", "no:perfsuite", "-p", "perfsuite.plugin"]
    here = own_plugin(Path(__file__).parents[1])
    assert here == ["-p", "no:perfsuite", "-p", "perfsuite.plugin.hooks"]
