"""Orchestration: resolve a scenario for the profile, measure it (``repeats``
fresh launches), judge it against the baseline, confirm an apparent regression
by measuring again, and (on request) record or calibrate the baseline.

One PerfSession per pytest session. Results are memoised by scenario id, so a
relation check and the scenario's own test share a single measurement.
"""

from __future__ import annotations

import math
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
    judge_imbalance,
    judge_metrics,
    judge_outcome,
    resolve_tolerances,
)
from perfsuite.fingerprint import stack_changes
from perfsuite.flops import mfu
from perfsuite.launch import Launcher, LaunchOutcome, WorkerJob
from perfsuite.launch.torchrun import TopologyError
from perfsuite.profiles import HardwareProfile
from perfsuite.relations import Relation, RelationOutcome, evaluate
from perfsuite.scenario import Scenario
from perfsuite.stats import ScenarioMetrics, Summary, aggregate, pool

#: Calibrated tolerance = this many standard deviations of the difference of
#: two independent measurements (sqrt(2) x the between-launch CV), Megatron's
#: 3-sigma rule applied to "new run vs stored baseline".
CALIBRATION_SIGMAS = 3.0
TOLERANCE_FLOOR = 0.02
TOLERANCE_CEILING = 0.9


@dataclass(frozen=True)
class RunSettings:
    """Session-wide choices from the command line."""

    profile: HardwareProfile
    baselines_dir: Path
    update_baselines: bool = False
    timeout_s: float | None = None
    workdir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    repeats: int = 1  # fresh launches pooled into one measurement
    confirm: int = 1  # extra measurements an apparent regression must survive
    slowdown_pct: float = 0.0  # planted extra work per step (gate self-test)
    calibrate: bool = False  # write recommended tolerances into the baselines


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


@dataclass
class ScenarioResult:
    scenario: Scenario  # resolved for the profile
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
        self.nodes: dict[str, dict[str, Any]] = {}  # host -> ranks seen there and its runtime
        self._workroot = settings.workdir or Path(tempfile.mkdtemp(prefix="perfsuite-"))

    @property
    def profile(self) -> HardwareProfile:
        return self.settings.profile

    def current_fingerprint(self) -> dict[str, Any]:
        fingerprint = {**self.fingerprint, "runtime": self.runtime}
        if len(self.nodes) > 1:
            fingerprint["nodes"] = self.nodes
        return fingerprint

    def _note_nodes(self, outcome: LaunchOutcome) -> None:
        """Remember each node's runtime (reported by its local rank 0)."""
        for report in outcome.reports:
            host, runtime = report.get("host", ""), report.get("runtime")
            node = self.nodes.setdefault(host, {"ranks": []})
            if report["rank"] not in node["ranks"]:
                node["ranks"].append(report["rank"])
            if runtime:
                node["runtime"] = runtime
                if report["rank"] == 0:
                    self.runtime = runtime

    def launch_info(self, measurement: Measurement | None = None) -> dict[str, Any]:
        topology = getattr(self.launcher, "topology", None)
        ranks = measurement.outcome.reports if measurement else []
        per_host: dict[str, int] = {}
        for report in ranks:
            per_host[report.get("host", "")] = per_host.get(report.get("host", ""), 0) + 1
        return {
            "launcher": self.launcher.name,
            "nnodes": topology.nnodes if topology else 1,
            "ranks_per_host": per_host,
        }

    # -- scenarios ------------------------------------------------------------
    def run(self, scenario: Scenario) -> ScenarioResult:
        """Run (once per session) and judge ``scenario`` on this profile.

        Raises :class:`BaselineError` before launching anything if the
        scenario's baseline file is unusable.
        """
        if scenario.id not in self.results:
            self.results[scenario.id] = self._run(scenario.resolve(self.profile.variant_keys))
        return self.results[scenario.id]

    def _run(self, scenario: Scenario) -> ScenarioResult:
        baseline = self.store.get(scenario.group, scenario.id)
        skip = self._precondition(scenario)
        if skip:
            return ScenarioResult(scenario, "skipped", Judgement("skipped", skip), baseline=baseline)
        measurement = self._measure(scenario)
        judgement = self._judge(scenario, measurement, baseline)
        attempts = [_attempt(measurement, judgement)]
        for _ in range(self.settings.confirm if judgement.verdict == "regression" else 0):
            # A regression must reproduce in a fresh measurement: noise rarely
            # strikes twice, so false alarms fall to about the square.
            measurement = self._measure(scenario)
            judgement = self._judge(scenario, measurement, baseline)
            attempts.append(_attempt(measurement, judgement))
            if judgement.verdict != "regression":
                judgement = _unconfirmed(judgement, attempts)
                break
        if judgement.verdict == "regression" and len(attempts) > 1:
            judgement = _confirmed(judgement, attempts)
        result = ScenarioResult(
            scenario, measurement.status, judgement, measurement.metrics, baseline, measurement.outcome,
            attempts=attempts, launch_info=self.launch_info(measurement),
        )  # fmt: skip
        result.extra_metrics.update(self._mfu(scenario, measurement))
        if (self.settings.update_baselines or self.settings.calibrate) and measurement.status in ("ok", "oom"):
            result.judgement = self._record(scenario, result)
        return result

    def _mfu(self, scenario: Scenario, measurement: Measurement) -> dict[str, Any]:
        if self.profile.device != "cuda" or measurement.metrics is None or not self.fingerprint.get("gpus"):
            return {}
        value = mfu(scenario.to_config(), measurement.metrics.step_time_median_s, self.fingerprint["gpus"][0]["name"])
        return {"mfu": value} if value else {}

    def _precondition(self, scenario: Scenario) -> str:
        """Why this scenario cannot run here, or "" if it can."""
        topology = getattr(self.launcher, "topology", None)
        keys = self.profile.variant_keys
        if scenario.only_on and not set(scenario.only_on) & set(keys):
            return f"runs on {', '.join(scenario.only_on)} profiles only; this is {self.profile.name}"
        if self.profile.max_world_size and scenario.world_size > self.profile.max_world_size:
            return (
                f"needs {scenario.world_size} ranks; profile {self.profile.name} runs at most "
                f"{self.profile.max_world_size} (one machine's cores)"
            )
        if self.profile.device == "cuda":
            nodes = topology.nnodes if topology else 1
            gpus = self.fingerprint.get("gpu_count", 0) * nodes
            if scenario.world_size > gpus:
                return f"needs {scenario.world_size} GPUs, {nodes} node(s) here have {gpus}"
        if topology is not None:
            try:
                topology.ranks_per_node(scenario.world_size)
            except TopologyError as exc:
                return str(exc)
        return ""

    def _measure(self, scenario: Scenario) -> Measurement:
        launches: list[LaunchOutcome] = []
        runs: list[ScenarioMetrics] = []
        for _ in range(self.settings.repeats):
            outcome = self.launcher.run(self._job(scenario))
            launches.append(outcome)
            self._note_nodes(outcome)
            if outcome.status != "ok":
                return Measurement(tuple(launches), None)
            runs.append(aggregate(outcome.reports, scenario.global_batch, scenario.seq_len))
        return Measurement(tuple(launches), pool(runs, scenario.global_batch, scenario.seq_len))

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
                "slowdown_pct": self.settings.slowdown_pct,
                "seed": 0,
            },
        }
        topology = getattr(self.launcher, "topology", None)
        per_node = topology.ranks_per_node(scenario.world_size) if topology else None
        return WorkerJob(spec, scenario.world_size, timeout, workdir, self.settings.worker_env, per_node)

    # -- judgement ------------------------------------------------------------
    def _judge(self, scenario: Scenario, measurement: Measurement, baseline: BaselineEntry | None) -> Judgement:
        outcome, metrics = measurement.outcome, measurement.metrics
        if outcome.status == "skipped":
            return Judgement("skipped", outcome.skip_reason)
        if outcome.status in ("crash", "timeout"):
            detail = outcome.failure.describe() if outcome.failure else ""
            return Judgement("error", f"workers {outcome.status}: {detail}")
        expected = baseline.expected if baseline else scenario.expected_outcome(self.profile.variant_keys)
        decided = judge_outcome(outcome.status, expected, baseline)
        if decided is not None or metrics is None or baseline is None:
            return decided or Judgement("error", "no metrics")
        changes = tuple(stack_changes(dict(baseline.fingerprint), self.current_fingerprint()))
        if metrics.samples_per_s.cv > self.profile.max_cv:
            return Judgement(
                "unreliable",
                f"samples/s varies too much to judge: CV {metrics.samples_per_s.cv:.1%} over this "
                f"profile's limit {self.profile.max_cv:.0%} (busy or throttled machine?)",
                stack_changes=changes,
            )
        tolerances = resolve_tolerances(self.profile.tolerances, scenario.tolerances, baseline)
        judgement = judge_metrics(metrics, baseline, tolerances, self.compare)
        if judgement.verdict != "regression":
            judgement = judge_imbalance(metrics, scenario.max_imbalance) or judgement
        return Judgement(judgement.verdict, judgement.message, judgement.checks, changes)

    # -- baselines ------------------------------------------------------------
    def _record(self, scenario: Scenario, result: ScenarioResult) -> Judgement:
        metrics: dict[str, Any] = {}
        tolerances: dict[str, float] | None = None
        extra: dict[str, Any] = {}
        if result.metrics is not None:
            m = result.metrics
            metrics = {
                "samples_per_s": m.samples_per_s.__dict__,
                "peak_mem_mib": round(m.peak_mem_mib, 1),
                "model_state_bytes_per_rank": m.model_state_bytes_per_rank,
            }
            if self.settings.calibrate:
                tolerances, extra["calibration"] = calibrated_tolerances(m, self.profile)
        entry = self.store.record(
            scenario.group, scenario.id, result.status, metrics, self.current_fingerprint(),
            tolerances=tolerances, extra=extra,
        )  # fmt: skip
        result.baseline = entry
        what = "baseline and calibrated tolerances" if tolerances else "baseline"
        return Judgement("recorded", f"{what} recorded in {self.store.path(scenario.group)}")

    # -- relations ------------------------------------------------------------
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


def _attempt(measurement: Measurement, judgement: Judgement) -> dict[str, Any]:
    m = measurement.metrics
    return {
        "status": measurement.status,
        "verdict": judgement.verdict,
        "message": judgement.message,
        "samples_per_s": m.samples_per_s.__dict__ if m else None,
        "peak_mem_mib": m.peak_mem_mib if m else None,
    }


def _confirmed(judgement: Judgement, attempts: list[dict[str, Any]]) -> Judgement:
    seen = ", ".join(f"{a['samples_per_s']['mean']:.4g}" for a in attempts if a["samples_per_s"])
    note = f" [confirmed by {len(attempts) - 1} fresh measurement(s); samples/s per measurement: {seen}]"
    return Judgement(judgement.verdict, judgement.message + note, judgement.checks, judgement.stack_changes)


def _unconfirmed(judgement: Judgement, attempts: list[dict[str, Any]]) -> Judgement:
    first = attempts[0]
    note = (
        f"first measurement looked like a regression ({first['message']}) but confirmation "
        f"measurement {len(attempts) - 1} did not reproduce it: treated as noise. "
    )
    return Judgement(judgement.verdict, note + judgement.message, judgement.checks, judgement.stack_changes)


def calibrated_tolerances(metrics: ScenarioMetrics, profile: HardwareProfile) -> tuple[dict[str, float], dict[str, Any]]:
    """Tolerances from the spread between launches (needs ``--perf-repeats`` >= 2).

    Throughput and peak memory get 3 sigma of the difference of two launches,
    clamped to [2%, 90%]; model-state bytes keep the profile's (they are exact).
    """
    repeats = metrics.repeats
    if len(repeats) < 2:
        raise BaselineError("calibration needs at least 2 repeats: pass --perf-repeats N with N >= 2")
    tolerances = {"model_state_bytes_per_rank": profile.tolerances["model_state_bytes_per_rank"]}
    spread: dict[str, Any] = {"repeats": len(repeats)}
    for metric in ("samples_per_s", "peak_mem_mib"):
        cv = Summary.of([r[metric] for r in repeats]).cv
        spread[f"cv_{metric}"] = cv
        tolerance = CALIBRATION_SIGMAS * math.sqrt(2) * cv
        tolerances[metric] = round(min(TOLERANCE_CEILING, max(TOLERANCE_FLOOR, tolerance)), 3)
    return tolerances, spread


__all__ = ["BaselineError", "PerfSession", "RunSettings", "ScenarioResult"]
