"""The session's work gate: each measured launch's counted step work (``--perf-work``), judged
against the counts stored beside the baselines and recorded with them. Decisions are
:mod:`perfsuite.judge.work`'s; this module reads the ranks' reports and the stores. Pytest side,
torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from perfsuite.core.workcount import WorkCount, merge
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.judge.results import Measurement
from perfsuite.judge.work import LIBRARIES, WorkVerdict, decide
from perfsuite.store.workstore import StoredWork, WorkStore


def counted(measurement: Measurement) -> WorkCount | None:
    """The last launch's counts, its ranks summed; None unless every rank counted."""
    reports = measurement.launches[-1].reports if measurement.launches else ()
    counts = [r.work_count for r in reports if r.work_count is not None]
    return merge(counts) if counts and len(counts) == len(reports) else None


def libraries(packages: Mapping[str, str]) -> dict[str, str]:
    """The library versions a recording names: those that change the ops a step calls."""
    return {name: packages[name] for name in LIBRARIES if name in packages}


class WorkGate:
    """The stored counts of each baselines folder this session reads, and their judgement."""

    def __init__(self, baselines_dir: Path) -> None:
        self.baselines_dir = baselines_dir
        self._stores: dict[str, WorkStore] = {}

    def store(self, folder: str) -> WorkStore:
        """The counts beside baselines folder ``folder`` (``<profile>`` or ``<profile>@<env>``)."""
        if folder not in self._stores:
            self._stores[folder] = WorkStore(self.baselines_dir, folder)
        return self._stores[folder]

    def judge(
        self, scenario: BaseScenario, folder: str, count: WorkCount | None, packages: Mapping[str, str]
    ) -> WorkVerdict:
        return decide(self.store(folder).get(scenario.group, scenario.id), count, packages, scenario.judge_work)

    def record(self, scenario: BaseScenario, folder: str, count: WorkCount | None, packages: Mapping[str, str]) -> str:
        """Store ``count`` as the scenario's; what to add to the verdict's message."""
        if count is None:
            return "no step work recorded: this run counted none"
        if not count.steady:
            return f"no step work recorded: the counted steps differed ({', '.join(count.varied[:3])})"
        path = self.store(folder).record(scenario.group, scenario.id, StoredWork(count, libraries(packages)))
        return f"step work recorded in {path}"
