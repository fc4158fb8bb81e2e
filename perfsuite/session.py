"""Orchestration: resolve a scenario for the profile, launch it, aggregate,
judge against the baseline and (on request) record it. One PerfSession per
pytest session; results are memoised by scenario id so a relation check and the
scenario's own test share a single run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.baselines import BaselineEntry, BaselineError, BaselineStore
from perfsuite.compare import (
    Judgement,
    MetricCheck,
    check_metric,
    judge_metrics,
    judge_outcome,
    resolve_tolerances,
)
from perfsuite.fingerprint import stack_changes
from perfsuite.launch import Launcher, LaunchOutcome, WorkerJob
from perfsuite.profiles import HardwareProfile
from perfsuite.relations import Relation, RelationOutcome, evaluate
from perfsuite.scenario import Scenario
from perfsuite.stats import ScenarioMetrics, aggregate


@dataclass(frozen=True)
class RunSettings:
    """Session-wide choices from the command line."""

    profile: HardwareProfile
    baselines_dir: Path
    update_baselines: bool = False
    timeout_s: float | None = None
    workdir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)


@dataclass
class ScenarioResult:
    scenario: Scenario  # resolved for the profile
    status: str
    judgement: Judgement
    metrics: ScenarioMetrics | None = None
    baseline: BaselineEntry | None = None
    launch: LaunchOutcome | None = None
    extra_metrics: dict[str, Any] = field(default_factory=dict)

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
            "checks": [
                {**c.__dict__, "delta": c.delta} for c in self.judgement.checks
            ],
            "stack_changes": list(self.judgement.stack_changes),
            "failure": failure.__dict__ if failure else None,
            "wall_s": self.launch.wall_s if self.launch else 0.0,
        }


class PerfSession:
    def __init__(
        self,
        settings: RunSettings,
        fingerprint: dict[str, Any],
        launcher: Launcher,
        compare: Callable[[MetricCheck], MetricCheck] = check_metric,
    ) -> None:
        self.settings = settings
        self.fingerprint = fingerprint
        self.launcher = launcher
        self.compare = compare
        self.store = BaselineStore(settings.baselines_dir, settings.profile.name)
        self.results: dict[str, ScenarioResult] = {}
        self.relations: dict[str, RelationOutcome] = {}
        self.runtime: dict[str, Any] = {}  # rank 0's torch/CUDA/NCCL builds, once seen
        self._workroot = settings.workdir or Path(tempfile.mkdtemp(prefix="perfsuite-"))

    @property
    def profile(self) -> HardwareProfile:
        return self.settings.profile

    def run(self, scenario: Scenario) -> ScenarioResult:
        """Run (once per session) and judge ``scenario`` on this profile.

        Raises :class:`BaselineError` before launching anything if the
        scenario's baseline file is unusable.
        """
        if scenario.id not in self.results:
            self.results[scenario.id] = self._run(scenario.resolve(self.profile.variant_keys))
        return self.results[scenario.id]

    def relation(self, relation: Relation) -> RelationOutcome:
        """Check a relation, running (or reusing) both of its scenarios."""
        if relation.id not in self.relations:
            self.relations[relation.id] = self._relation(relation)
        return self.relations[relation.id]

    def _relation(self, relation: Relation) -> RelationOutcome:
        keys = self.profile.variant_keys
        if relation.only_on and not set(relation.only_on) & set(keys):
            where = ", ".join(relation.only_on)
            return RelationOutcome(relation, "skipped", f"holds on {where} profiles only, this is {self.profile.name}")
        left, right = self.run(relation.left), self.run(relation.right)
        return evaluate(relation, left, right, left.scenario.world_size)

    def _run(self, scenario: Scenario) -> ScenarioResult:
        baseline = self.store.get(scenario.group, scenario.id)
        skip = self._precondition(scenario)
        if skip:
            return ScenarioResult(scenario, "skipped", Judgement("skipped", skip), baseline=baseline)
        outcome = self.launcher.run(self._job(scenario))
        if outcome.reports:
            self.runtime = outcome.reports[0].get("runtime") or self.runtime
        metrics = None
        if outcome.status == "ok":
            metrics = aggregate(outcome.reports, scenario.global_batch, scenario.seq_len)
        judgement = self._judge(scenario, outcome, metrics, baseline)
        result = ScenarioResult(scenario, outcome.status, judgement, metrics, baseline, outcome)
        if self.settings.update_baselines and outcome.status in ("ok", "oom"):
            result.judgement = self._record(scenario, result)
        return result

    def _precondition(self, scenario: Scenario) -> str:
        if self.profile.device == "cuda":
            gpus = self.fingerprint.get("gpu_count", 0)
            if scenario.world_size > gpus:
                return f"needs {scenario.world_size} GPUs, this machine has {gpus}"
        return ""

    def _job(self, scenario: Scenario) -> WorkerJob:
        workdir = Path(tempfile.mkdtemp(prefix=f"{scenario.id}-", dir=self._workroot))
        timeout = self.settings.timeout_s or scenario.timeout_s or self.profile.timeout_s
        spec = {
            "scenario": scenario.to_config(),
            "run": {
                "device": self.profile.device,
                "reports_dir": str(workdir / "reports"),
                "rank_memory_budget_mib": self.profile.rank_memory_budget_mib,
                "device_memory_cap_mib": self.profile.device_memory_cap_mib,
                "steady_threshold": self.profile.steady_threshold,
                "seed": 0,
            },
        }
        return WorkerJob(spec, scenario.world_size, timeout, workdir, self.settings.worker_env)

    def _judge(
        self,
        scenario: Scenario,
        outcome: LaunchOutcome,
        metrics: ScenarioMetrics | None,
        baseline: BaselineEntry | None,
    ) -> Judgement:
        if outcome.status == "skipped":
            return Judgement("skipped", outcome.skip_reason)
        if outcome.status in ("crash", "timeout"):
            detail = outcome.failure.describe() if outcome.failure else ""
            return Judgement("error", f"workers {outcome.status}: {detail}")
        expected = baseline.expected if baseline else scenario.expected_outcome(self.profile.variant_keys)
        decided = judge_outcome(outcome.status, expected, baseline)
        if decided is not None or metrics is None or baseline is None:
            return decided or Judgement("error", "no metrics")
        tolerances = resolve_tolerances(self.profile.tolerances, scenario.tolerances, baseline)
        judgement = judge_metrics(metrics, baseline, tolerances, self.compare)
        changes = tuple(stack_changes(dict(baseline.fingerprint), self.current_fingerprint()))
        return Judgement(judgement.verdict, judgement.message, judgement.checks, changes)

    def current_fingerprint(self) -> dict[str, Any]:
        return {**self.fingerprint, "runtime": self.runtime}

    def _record(self, scenario: Scenario, result: ScenarioResult) -> Judgement:
        metrics: dict[str, Any] = {}
        if result.metrics is not None:
            m = result.metrics
            metrics = {
                "samples_per_s": m.samples_per_s.__dict__,
                "peak_mem_mib": round(m.peak_mem_mib, 1),
                "model_state_bytes_per_rank": m.model_state_bytes_per_rank,
            }
        entry = self.store.record(
            scenario.group,
            scenario.id,
            result.status,
            metrics,
            self.current_fingerprint(),
        )
        result.baseline = entry
        return Judgement(
            "recorded", f"baseline recorded in {self.store.path(scenario.group)}"
        )


__all__ = ["BaselineError", "PerfSession", "RunSettings", "ScenarioResult"]
