"""``--perf-ab BASE,CANDIDATE``: instead of judging against baselines, run each scenario
alternately in two environments, pair by pair until the sequential A/B decides whether the
candidate is slower by the minimum effect (the statistics are :mod:`perfsuite.judge.abtest`
and :mod:`perfsuite.judge.sequential`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from perfsuite.core.profiles import CPU, GPU_MIN_EFFECT, HardwareProfile
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.judge import sequential
from perfsuite.judge.abtest import FLAG, ABResult, run_ab, summary_lines
from perfsuite.judge.compare import resolve_tolerances
from perfsuite.judge.coverage import Outcome
from perfsuite.judge.results import OneLaunch
from perfsuite.launch.envs import EnvError, parse_ab, parse_envs
from perfsuite.plugin import exitstatus
from perfsuite.plugin.modes.base import Mode, say_nothing_measured

if TYPE_CHECKING:
    from perfsuite.gate.session import PerfSession


MIN_EFFECT_FLAG = "--perf-min-effect"


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
            "pairs A B, B A, ... until the sequential test says regression or pass (no slowdown of the minimum "
            "effect) or --perf-ab-max-pairs are spent (undecided: not judged); no baselines",
        )
        group.addoption(
            MIN_EFFECT_FLAG,
            metavar="FRACTION",
            type=float,
            default=None,
            help="the smallest slowdown that matters, e.g. 0.02 (steps 2%% slower); the A/B's regression/pass "
            "decision is judged against it (default: the scenario's min_effect, else the profile's: "
            f"{CPU.min_effect:g} on cpu, {GPU_MIN_EFFECT:g} on GPUs)",
        )
        group.addoption(
            "--perf-ab-max-pairs",
            metavar="N",
            type=int,
            default=sequential.MAX_PAIRS,
            help=f"A/B: most pairs per scenario before it is undecided (default {sequential.MAX_PAIRS})",
        )
        group.addoption(
            "--perf-ab-budget",
            metavar="SECONDS",
            type=float,
            default=None,
            help="A/B: no new pair after this many seconds on one scenario (undecided if none decided)",
        )
        group.addoption("--perf-ab-tolerance", metavar="FRACTION", type=float, default=None, help=argparse.SUPPRESS)
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
            # Only the A/B reads them: given alone, they would change nothing and say nothing.
            for flag in (MIN_EFFECT_FLAG, "--perf-ab-budget"):
                if config.getoption(flag) is not None:
                    raise pytest.UsageError(f"{flag} only applies with {cls.flag}: add {cls.flag} A,B")
            return
        super().check_options(config)
        if config.getoption("--perf-ab-tolerance") is not None:
            raise pytest.UsageError(
                f"--perf-ab-tolerance is gone: the A/B judges the headline against the smallest slowdown that "
                f"matters, {MIN_EFFECT_FLAG} FRACTION (e.g. 0.05), and peak memory against its tolerance"
            )
        effect = config.getoption(MIN_EFFECT_FLAG)
        if effect is not None and not 0 < effect < 10:  # nan passes no comparison
            raise pytest.UsageError(f"{MIN_EFFECT_FLAG} takes a slowdown fraction above 0 (0.02 = 2%), got {effect}")
        pairs = config.getoption("--perf-ab-max-pairs")
        if not sequential.FIRST_LOOK <= pairs <= sequential.MOST_PAIRS:
            raise pytest.UsageError(
                f"--perf-ab-max-pairs takes {sequential.FIRST_LOOK} to {sequential.MOST_PAIRS} pairs, got {pairs}"
            )
        budget = config.getoption("--perf-ab-budget")
        if budget is not None and not (math.isfinite(budget) and budget > 0):
            raise pytest.UsageError(f"--perf-ab-budget must be a positive number of seconds, got {budget}")
        slowdown = config.getoption("--perf-ab-inject-slowdown")
        if not (math.isfinite(slowdown) and slowdown >= 0):  # nan passes no comparison
            raise pytest.UsageError(f"--perf-ab-inject-slowdown must be a non-negative percentage, got {slowdown}")

    def check(self, session: PerfSession, scenario: BaseScenario, nodeid: str) -> ABResult:
        fitted = session.prepare(scenario)
        if fitted.skip is not None:
            pytest.skip(f"{scenario.id}: {fitted.skip}")
        resolved = fitted.scenario
        slowdown = self.config.getoption("--perf-ab-inject-slowdown")
        tolerances = gated(resolved.primary, compared(resolved), resolved.tolerances, session.profile)

        def run_once(env: str) -> OneLaunch:
            return session.launch_once(resolved, env, slowdown if env == self.candidate else 0.0)

        plan = design(self.config, resolved.min_effect or session.profile.min_effect)
        budget = self.config.getoption("--perf-ab-budget")
        result = run_ab(resolved.id, list(tolerances), run_once, self.base, self.candidate, plan, tolerances, budget)
        self.results.append(result)
        if result.verdict == "skipped":
            pytest.skip(f"{scenario.id}: {result.message}")
        if result.verdict in ("unreliable", "undecided"):  # as the gate does: neither green nor a false alarm
            pytest.skip(f"{scenario.id}: A/B {result.verdict}: {result.message}")
        if result.verdict in ("regression", "error"):
            pytest.fail(f"{scenario.id}: A/B {result.verdict}: {result.message}", pytrace=False)
        return result

    def outcomes(self, session: PerfSession | None) -> list[Outcome]:
        held = exitstatus.entries_of(self.config)
        # The A/B judges speed alone, against the other side on this machine.
        decided = ("pass", "regression")
        return [Outcome(r.id, r.verdict, r.message, r.id in held, timing=r.verdict in decided) for r in self.results]

    def summary(self, terminalreporter: Any, session: PerfSession | None) -> None:
        if self.results:
            terminalreporter.write_sep("-", f"perfsuite A/B ({self.base},{self.candidate})")
            for line in summary_lines(self.results):
                terminalreporter.write_line(line)
        say_nothing_measured(terminalreporter, self.nothing_measured(session))

    def nothing_measured(self, session: PerfSession | None) -> str:
        if any(r.headline for r in self.results):
            return ""
        return f"{FLAG}: no scenario was compared in both environments, so this A/B proves nothing and exits non-zero"

    def results_json(self, session: PerfSession | None = None) -> Mapping[str, Any]:
        return {"ab": [r.to_json() for r in self.results]}


def compared(scenario: BaseScenario) -> list[str]:
    """The metrics an A/B may compare: the kind's, less those that follow a rank's pick (a best
    shape's memory). Launches that picked differently differ in them, and no launch's pick is kept."""
    picked = {name for names in scenario.picks().values() for name in names}
    return [name for name in scenario.metrics if name not in picked]


def gated(primary: str, metrics: Sequence[str], own: Mapping[str, float], profile: HardwareProfile) -> dict[str, float]:
    """The metrics an A/B compares, headline first, with their tolerances: what the gate would gate
    (the registry's defaults for this device, then the profile's and the scenario's ``own``). The
    headline's is unused: the sequential test judges it against the minimum effect. No baseline is
    involved."""
    tolerances = resolve_tolerances(profile.default_tolerances(metrics), own, None)
    rest = {name: tolerances[name] for name in metrics if name in tolerances and name != primary}
    return {primary: tolerances.get(primary, 0.0), **rest}


def design(config: pytest.Config, min_effect: float) -> sequential.Design:
    """The sequential design of one scenario's A/B: ``--perf-min-effect`` over its own minimum
    effect (the scenario's, else the profile's), and the pairs it may spend."""
    flag = config.getoption(MIN_EFFECT_FLAG)
    return sequential.Design(flag or min_effect, max_pairs=config.getoption("--perf-ab-max-pairs"))


def _pair(config: pytest.Config) -> tuple[str, str] | None:
    """The (base, candidate) environments named by ``--perf-ab`` (None without it)."""
    try:
        return parse_ab(config.getoption(FLAG), parse_envs(config.getoption("--perf-env")))
    except EnvError as exc:
        raise pytest.UsageError(str(exc)) from None
