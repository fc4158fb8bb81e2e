"""What a scenario's run produces, as the session's modules pass it around.

A :class:`Measurement` is ``repeats`` fresh launches pooled; a
:class:`ScenarioResult` is the judged scenario as the plugin, the report,
the extra-metric hooks and the exporters see it. Defined once here so that
launching, judging and recording share them without importing the session.
``baseline_metrics`` is how a baseline (and each attempt in a result) stores
measured metrics. Pytest side, torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core.engines import MissingPackage
from perfsuite.core.workcount import WorkCount
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.judge.ceilings import Ceilings
from perfsuite.judge.compare import Judgement
from perfsuite.judge.explain import Explanation
from perfsuite.judge.repro import Repro
from perfsuite.judge.stats import ScenarioMetrics, Summary
from perfsuite.judge.work import WorkVerdict
from perfsuite.launch import LaunchOutcome
from perfsuite.store.baselines import BaselineEntry


@dataclass(frozen=True)
class Measurement:
    """``repeats`` launches of one scenario; metrics pooled when all trained."""

    launches: tuple[LaunchOutcome, ...]
    metrics: ScenarioMetrics | None

    @property
    def status(self) -> str:
        failed = [o.status for o in self.launches if o.status != "ok"]
        return failed[0] if failed else "ok"

    @property
    def outcome(self) -> LaunchOutcome:
        """The launch that decides the status (first failure, else the last)."""
        return next((o for o in self.launches if o.status != "ok"), self.launches[-1])


@dataclass(frozen=True)
class OneLaunch:
    """One fresh launch of a prepared scenario, as an A/B compares it: its status, each metric's
    value (none unless it trained), why it failed or was skipped, and why it was measured under
    contention (None if it was not)."""

    status: str
    values: dict[str, float]
    message: str = ""
    contended: str | None = None
    steal_cores: float = 0.0
    """CPU cores the hypervisor stole meanwhile (an A/B reports it without counting it)."""


@dataclass
class ScenarioResult:
    scenario: BaseScenario  # resolved for the profile
    status: str
    judgement: Judgement
    metrics: ScenarioMetrics | None = None
    baseline: BaselineEntry | None = None
    launch: LaunchOutcome | None = None
    extra_metrics: dict[str, Any] = field(default_factory=dict)
    #: Every measurement taken (first, then confirmations) with its verdict.
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: Launcher, nodes and ranks per node this result was measured with.
    launch_info: dict[str, Any] = field(default_factory=dict)
    #: Its op profile against the baseline's (perfsuite.gate.profiling), when one was taken.
    explanation: Explanation | None = None
    #: The engine package whose absence skipped it, when that is why (perfsuite.gate.fitting.launch_missing).
    missing: MissingPackage | None = None
    #: What one step did, counted over the ranks (``--perf-work``), and the work gate's finding.
    work_count: WorkCount | None = None
    work: WorkVerdict | None = None
    #: How to run it again and settle it, when it failed (:mod:`perfsuite.judge.repro`).
    repro: Repro | None = None

    @property
    def verdict(self) -> str:
        return self.judgement.verdict

    def to_json(self) -> dict[str, Any]:
        metrics = self.metrics.to_json() if self.metrics else {}
        if self.extra_metrics:
            metrics["extra"] = self.extra_metrics
        failure = self.launch.failure if self.launch else None
        return {
            "id": self.scenario.id,
            "group": self.scenario.group,
            "status": self.status,
            "config": self.scenario.to_config(),
            "metrics": metrics,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "verdict": self.verdict,
            "message": self.judgement.message,
            "checks": [{**c.__dict__, "delta": c.delta} for c in self.judgement.checks],
            "stack_changes": list(self.judgement.stack_changes),
            "attempts": self.attempts,
            "launch": self.launch_info,
            "failure": failure.__dict__ if failure else None,
            "wall_s": self.launch.wall_s if self.launch else 0.0,
            "op_profile": self.explanation.to_json() if self.explanation else None,
            "repro": self.repro.to_json() if self.repro else None,
            "work": {
                "count": self.work_count.to_json() if self.work_count else None,
                **(self.work.to_json() if self.work else {"status": "not_counted", "message": "", "diff": None}),
            },
        }


def no_extra_metrics(result: ScenarioResult, ceilings: Ceilings) -> dict[str, Any]:
    return {}


def baseline_metrics(metrics: ScenarioMetrics) -> dict[str, Any]:
    """Every measured metric as a baseline stores it: {mean, std, n} where kept
    with its spread, else the number (floats to 6 significant digits)."""
    stored: dict[str, Any] = {}
    for name, value in metrics.values.items():
        if isinstance(value, Summary):
            stored[name] = asdict(value)
        elif registry.get(name).noisy and isinstance(value, float):
            stored[name] = float(f"{value:.6g}")
        else:
            stored[name] = value  # exact: kept as measured
    return stored


def attempt(scenario: BaseScenario, measurement: Measurement, judgement: Judgement) -> dict[str, Any]:
    """One measurement as a result's ``attempts`` list keeps it: status, verdict,
    message and the scenario's metrics as a baseline would store them."""
    stored = baseline_metrics(measurement.metrics) if measurement.metrics else {}
    return {
        "status": measurement.status,
        "verdict": judgement.verdict,
        "message": judgement.message,
        **{name: stored.get(name) for name in scenario.metrics},
    }
