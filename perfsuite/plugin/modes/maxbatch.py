"""``--perf-find-max-batch``: instead of judging, search each train scenario's largest
micro-batch that fits (the search itself is :mod:`perfsuite.plugin.modes.batchsearch`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from perfsuite.core.workloads.base import BaseScenario
from perfsuite.core.workloads.train import Scenario
from perfsuite.judge.coverage import Outcome
from perfsuite.plugin.modes.base import Mode, say_nothing_measured
from perfsuite.plugin.modes.batchsearch import (
    DEFAULT_LIMIT,
    FLAG,
    LIMIT_FLAG,
    START_FLAG,
    MaxBatchResult,
    MaxBatchSearch,
    resolved_here,
    trial_runner,
)

if TYPE_CHECKING:
    from perfsuite.gate.session import PerfSession


class MaxBatchMode(Mode):
    flag = FLAG
    incompatible = ("--perf-update-baselines", "--perf-calibrate")
    why_incompatible = "reads and writes no baseline, so run them separately"
    reads_baselines = False
    no_relations = (
        f"relations compare scenarios measured at their own batch; {FLAG} only searches batch sizes, so none is checked"
    )

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config)
        self.results: dict[str, MaxBatchResult] = {}  # by scenario id: one search per session

    @classmethod
    def add_options(cls, group: Any) -> None:
        group.addoption(
            FLAG,
            action="store_true",
            help="instead of judging train scenarios against baselines, find the largest micro-batch that "
            "fits in memory (real OOMs, fresh ranks per trial; reads and writes no baseline)",
        )
        group.addoption(
            START_FLAG, metavar="N", type=int, help=f"{FLAG}: first micro-batch tried (default: the scenario's own)"
        )
        group.addoption(
            LIMIT_FLAG,
            metavar="N",
            type=int,
            default=DEFAULT_LIMIT,
            help=f"{FLAG}: largest micro-batch tried (default {DEFAULT_LIMIT})",
        )

    @classmethod
    def check_options(cls, config: pytest.Config) -> None:
        start, limit = config.getoption(START_FLAG), config.getoption(LIMIT_FLAG)
        if not cls.selected(config):
            if start is not None or limit != DEFAULT_LIMIT:
                raise pytest.UsageError(f"{START_FLAG} and {LIMIT_FLAG} only apply with {FLAG}: add {FLAG}")
            return
        super().check_options(config)
        if limit < 1:
            raise pytest.UsageError(f"{LIMIT_FLAG} must be >= 1, got {limit}")
        if start is not None and not 1 <= start <= limit:
            raise pytest.UsageError(f"{START_FLAG} must be between 1 and {LIMIT_FLAG}={limit}, got {start}")

    def check(self, session: PerfSession, scenario: BaseScenario, nodeid: str) -> MaxBatchResult:
        """Search ``scenario`` once per session; a search that stopped on a crash fails the test."""
        if scenario.id not in self.results:
            resolved, why = resolved_here(session, scenario)
            if why is not None or not isinstance(resolved, Scenario):
                pytest.skip(f"{scenario.id}: {why}")
            start = self.config.getoption(START_FLAG) or resolved.micro_batch
            limit = self.config.getoption(LIMIT_FLAG)
            trials = MaxBatchSearch(start, limit, trial_runner(session, resolved)).run()
            self.results[scenario.id] = MaxBatchResult(resolved, min(start, limit), limit, trials)
        result = self.results[scenario.id]
        stop = result.stopped_by
        if stop is not None:
            where = f"{result.scenario.id}: max-batch search stopped at micro-batch {stop.micro_batch}"
            if stop.status == "skipped":
                pytest.skip(f"{where}: skipped: {stop.message}")
            pytest.fail(f"{where}: {stop.status} (not an OOM): {stop.message}", pytrace=False)
        return result

    def outcomes(self, session: PerfSession | None) -> list[Outcome]:
        return [
            Outcome(r.scenario.id, "searched" if r.measured else "not_measured", r.headline())
            for r in self.results.values()
        ]

    def summary(self, terminalreporter: Any, session: PerfSession | None) -> None:
        profile = session.profile.name if session is not None else "-"
        terminalreporter.write_sep("-", f"perfsuite max batch (profile {profile})")
        for result in self.results.values():
            for line in result.lines():
                terminalreporter.write_line(line)
        say_nothing_measured(terminalreporter, self.nothing_measured(session))

    def nothing_measured(self, session: PerfSession | None) -> str:
        if any(r.measured for r in self.results.values()):
            return ""
        return (
            f"{FLAG}: no train scenario ran a trial here (other kinds and scenarios that cannot run skip), "
            "so this run found nothing and exits non-zero"
        )

    def results_json(self, session: PerfSession | None = None) -> Mapping[str, Any]:
        return {"max_batch": [r.to_json() for r in self.results.values()]}
