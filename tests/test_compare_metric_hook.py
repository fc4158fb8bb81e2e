"""The ``pytest_perfsuite_compare_metric`` hook: a conftest that implements it decides a metric's
outcome, and one that returns None leaves the default rule. The plugin runs in-process over a
pytester project whose launches are canned (no torchrun), so each case takes well under a second."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

import pytest
import scipy.stats  # noqa: F401  # here, not first in a pytester run, which unloads what it imported
from conftest import CPU_PROFILE

from perfsuite.core.protocol import RankReport
from perfsuite.launch import Launcher, LaunchOutcome, WorkerJob

STEADY = (0.100, 0.101, 0.099, 0.100, 0.100)  # CV under 1%
SLOW = tuple(t * 2 for t in STEADY)  # half the throughput: far beyond cpu's tolerance

MODULE = textwrap.dedent(
    """
    from perfsuite import ModelSpec, Scenario, parametrize

    SCENARIOS = [Scenario("g", "s", ModelSpec("bert", 1, 32, 2, 512, 32), world_size=2, micro_batch=2,
                          global_batch=4, seq_len=16, steps=5)]

    @parametrize(SCENARIOS)
    def test_bench(perf, scenario):
        perf.check(scenario)
    """
)
#: The hook as a team writes it: its own rule for throughput, the default for everything else.
LOOSER_THROUGHPUT = textwrap.dedent(
    """
    from dataclasses import replace
    from perfsuite.judge.compare import check_metric

    def pytest_perfsuite_compare_metric(check):
        if check.metric != "samples_per_s":
            return None
        return check_metric(replace(check, tolerance=0.75))
    """
)
STRICTER_MEMORY = textwrap.dedent(
    """
    from dataclasses import replace

    def pytest_perfsuite_compare_metric(check):
        return replace(check, outcome="regression") if check.metric == "peak_mem_mib" else None
    """
)
DEFAULT_RULE = textwrap.dedent(
    """
    def pytest_perfsuite_compare_metric(check):
        return None
    """
)


class CannedLauncher(Launcher):
    """Every launch: two ranks that report ``steps`` as their step times."""

    name = "canned"

    def __init__(self, steps: Sequence[float]) -> None:
        self.steps = tuple(steps)

    def run(self, job: WorkerJob) -> LaunchOutcome:
        state = {"params": 1, "grads": 1, "optimizer": 2, "total": 4}
        parts = {f"model_state.{k}": v for k, v in state.items() if k != "total"}
        metrics = {"peak_mem_mib": 100.0, "model_state_bytes_per_rank": 4, **parts}
        reports = [
            RankReport(
                rank=r,
                status="ok",
                step_times_s=self.steps,
                steady_state_start=2,
                runtime={"torch": "2.13.0"},
                model_state=state,
                metrics=metrics,
            )
            for r in (0, 1)
        ]
        return LaunchOutcome("ok", reports)


@pytest.fixture
def gate(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project whose baseline was recorded from steady launches."""
    pytester.makepyfile(test_team=MODULE)
    pytester.mkdir("baselines")
    use(monkeypatch, STEADY)
    pytester.makeconftest(DEFAULT_RULE)
    assert run(pytester, "--perf-update-baselines")["verdict"] == "recorded"
    return pytester


def use(monkeypatch: pytest.MonkeyPatch, steps: Sequence[float]) -> None:
    """The plugin's launches (in this process) report ``steps``."""
    launcher = CannedLauncher(steps)
    monkeypatch.setattr("perfsuite.plugin.machine.launcher", lambda config: launcher)


def run(pytester: pytest.Pytester, *args: str) -> dict[str, object]:
    """The scenario's result from one in-process gate run on the cpu profile."""
    outcome = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", CPU_PROFILE, "--perf-op-profiles=off", "--perf-json", "out.json", *args
    )
    assert outcome.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), outcome.stdout.str()
    (result,) = json.loads((pytester.path / "out.json").read_text())["results"]
    return dict(result)


def outcomes(result: dict[str, object]) -> dict[str, str]:
    checks = result["checks"]
    assert isinstance(checks, list)
    return {c["metric"]: c["outcome"] for c in checks}


def test_returning_none_keeps_the_default_rule(gate: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, SLOW)
    result = run(gate)
    assert result["verdict"] == "regression"
    assert outcomes(result)["samples_per_s"] == "regression"


def test_a_looser_rule_turns_the_regression_into_a_pass(gate: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, SLOW)
    gate.makeconftest(LOOSER_THROUGHPUT)
    result = run(gate)
    assert result["verdict"] == "pass"
    assert outcomes(result)["samples_per_s"] == "pass"


def test_a_stricter_rule_turns_a_pass_into_a_regression(gate: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, STEADY)
    gate.makeconftest(STRICTER_MEMORY)
    result = run(gate)
    assert result["verdict"] == "regression"
    found = outcomes(result)
    assert found["peak_mem_mib"] == "regression" and found["samples_per_s"] == "pass"


def test_the_default_passes_steady_launches(gate: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, STEADY)
    assert run(gate)["verdict"] == "pass"
