"""``python -m perfsuite profile``: the profile the gate picks here, after the repository's conftest
hooks, which ``doctor``, ``bootstrap`` and the workflow ``init`` writes all use (issue 39)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import TINY, TINY_SHAPE

TEAM_CONFTEST = textwrap.dedent(
    """
    from dataclasses import replace
    from perfsuite.core.profiles import BUILTIN_PROFILES

    def pytest_perfsuite_profiles():
        return [replace(BUILTIN_PROFILES["cpu"], name="team-runner", description="our runners")]

    def pytest_perfsuite_hardware_key(fingerprint):
        return "team-runner"
    """
)


@pytest.fixture
def team(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(TEAM_CONFTEST)
    (pytester.path / "bench_tests").mkdir()
    (pytester.path / "bench_tests" / "test_team.py").write_text(
        textwrap.dedent(f"""
        from perfsuite import ModelSpec, Scenario, parametrize

        @parametrize([Scenario("team", "ddp", {TINY}, strategy="ddp", {TINY_SHAPE})])
        def test_team(perf, scenario):
            perf.check(scenario)
        """)
    )
    return pytester


def perfsuite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.run(sys.executable, "-m", "perfsuite", *args)


def test_a_profile_a_conftest_hook_picks_is_the_one_profile_doctor_and_bootstrap_use(team: pytest.Pytester) -> None:
    picked = perfsuite(team, "profile")
    assert picked.ret == 0, picked.stderr.str()
    assert picked.outlines == ["team-runner"]
    doctor = perfsuite(team, "doctor", "--no-smoke")
    doctor.stdout.fnmatch_lines(["profile: team-runner (device cpu)"])
    plan = perfsuite(team, "bootstrap", "--dry-run", "--budget", "5m")
    assert plan.ret == 0, plan.stderr.str()
    plan.stdout.fnmatch_lines(["profile team-runner (cpu), budget 5m00s:"])


def test_an_unknown_profile_is_refused_naming_the_known_ones(team: pytest.Pytester) -> None:
    refused = perfsuite(team, "profile", "--perf-profile", "nope")
    assert refused.ret == 2 and refused.outlines == []
    assert "unknown profile 'nope'" in refused.stderr.str() and "team-runner" in refused.stderr.str()
