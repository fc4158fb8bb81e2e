"""``--perf-ab BASE,CANDIDATE``: instead of judging against baselines, run each scenario
alternately in two environments and test whether the candidate is worse
(the statistics are :mod:`perfsuite.judge.abtest`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from perfsuite.judge.abtest import FLAG, ABResult, run_ab, summary_lines
from perfsuite.judge.compare import resolve_tolerances
from perfsuite.judge.coverage import Outcome
from perfsuite.launch.envs import EnvError, parse_ab, parse_envs
from perfsuite.plugin import exitstatus
from perfsuite.plugin.modes.base import Mode, say_nothing_measured
from perfsuite.spec.profiles import HardwareProfile
from perfsuite.spec.workloads.base import BaseScenario

if TYPE_CHECKING:
    from perfsuite.gate.session import PerfSession


class ABMode(Mode):
    flag = FLAG
    incompatible = ("--perf-update-baselines", "--perf-calibrate", "--perf-find-max-batch")
    why_incompatible = "reads and writes no baselines"
    reads_baselines = False
    no_relations = f"{FLAG} compares two environments, not scenarios with each other"

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config)
        pair = _pair(config)
        assert pair is not None  # selected: --perf-ab is given
        self.base, self.candidate = pair
        self.results: list[ABResult] = []

    @classmethod
    def add_options(cls, group: Any) -> None:
        group.addoption(
            FLAG,
            metavar="BASE,CANDIDATE",
            help="interleaved A/B of two environments ('current' is this interpreter): each scenario runs "
            "A B A B ... for --perf-repeats pairs and fails if the candidate is significantly worse; no baselines",
        )
        group.addoption(
            "--perf-ab-tolerance",
            metavar="FRACTION",
            type=float,
            default=0.05,
            help="A/B: worse by more than this (relative) and significant is a regression (default 0.05)",
        )
        group.addoption(
            "--perf-ab-inject-slowdown",
            metavar="PCT",
            type=float,
            default=0.0,
            help="A/B self-test: the candidate's workers do PCT%% more real device work per step",
        )

    @classmethod
    def selected(cls, config: pytest.Config) -> bool:
        return _pair(config) is not None

    @classmethod
    def check_options(cls, config: pytest.Config) -> None:
        if not cls.selected(config):
            return
        super().check_options(config)
        if config.getoption("--perf-repeats") < 3:
            raise pytest.UsageError(f"{FLAG} needs --perf-repeats N with N >= 3 pairs for its paired test")
        if not 0 <= config.getoption("--perf-ab-tolerance") < 1:
            raise pytest.UsageError("--perf-ab-tolerance must be in [0, 1)")
        slowdown = config.getoption("--perf-ab-inject-slowdown")
        if not (math.isfinite(slowdown) and slowdown >= 0):  # nan passes no comparison
            raise pytest.UsageError(f"--perf-ab-inject-slowdown must be a non-negative percentage, got {slowdown}")

    def check(self, session: PerfSession, scenario: BaseScenario, nodeid: str) -> ABResult:
        resolved, skip = session.prepare(scenario)
        if skip:
            pytest.skip(f"{scenario.id}: {skip}")
        slowdown = self.config.getoption("--perf-ab-inject-slowdown")
        tolerance = self.config.getoption("--perf-ab-tolerance")
        tolerances = gated(resolved.primary, compared(resolved), resolved.tolerances, session.profile, tolerance)

        def run_once(env: str) -> tuple[str, dict[str, float], str, str]:
            return session.launch_once(resolved, env, slowdown if env == self.candidate else 0.0)

        pairs = self.config.getoption("--perf-repeats")
        result = run_ab(resolved.id, list(tolerances), run_once, self.base, self.candidate, pairs, tolerances)
        self.results.append(result)
        if result.verdict == "skipped":
            pytest.skip(f"{scenario.id}: {result.message}")
        if result.verdict == "unreliable":  # as the gate does: neither green nor a false alarm
            pytest.skip(f"{scenario.id}: A/B unreliable: {result.message}")
        if result.verdict in ("regression", "error"):
            pytest.fail(f"{scenario.id}: A/B {result.verdict}: {result.message}", pytrace=False)
        return result

    def outcomes(self, session: PerfSession | None) -> list[Outcome]:
        held = exitstatus.entries_of(self.config)
        return [Outcome(r.id, r.verdict, r.message, r.id in held) for r in self.results]

    def summary(self, terminalreporter: Any, session: PerfSession | None) -> None:
        if self.results:
            terminalreporter.write_sep("-", f"perfsuite A/B ({self.base},{self.candidate})")
            for line in summary_lines(self.results):
                terminalreporter.write_line(line)
        say_nothing_measured(terminalreporter, self.nothing_measured(session))

    def nothing_measured(self, session: PerfSession | None) -> str:
        if any(r.comparisons for r in self.results):
            return ""
        return f"{FLAG}: no scenario was compared in both environments, so this A/B proves nothing and exits non-zero"

    def results_json(self) -> Mapping[str, Any]:
        return {"ab": [r.to_json() for r in self.results]}


def compared(scenario: BaseScenario) -> list[str]:
    """The metrics an A/B may compare: the kind's, less those that follow a rank's pick (a best
    shape's memory). Launches that picked differently differ in them, and no launch's pick is kept."""
    picked = {name for names in scenario.picks().values() for name in names}
    return [name for name in scenario.metrics if name not in picked]


def gated(
    primary: str, metrics: Sequence[str], own: Mapping[str, float], profile: HardwareProfile, tolerance: float
) -> dict[str, float]:
    """The metrics an A/B compares, headline first, with their tolerances: what the gate would gate
    (the registry's defaults for this device, then the profile's and the scenario's ``own``), and
    ``tolerance`` (``--perf-ab-tolerance``) for the headline metric. No baseline is involved."""
    tolerances = resolve_tolerances(profile.default_tolerances(metrics), own, None)
    rest = {name: tolerances[name] for name in metrics if name in tolerances and name != primary}
    return {primary: tolerance, **rest}


def _pair(config: pytest.Config) -> tuple[str, str] | None:
    """The (base, candidate) environments named by ``--perf-ab`` (None without it)."""
    try:
        return parse_ab(config.getoption(FLAG), parse_envs(config.getoption("--perf-env")))
    except EnvError as exc:
        raise pytest.UsageError(str(exc)) from None
