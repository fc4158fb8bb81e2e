"""Orchestration: resolve a scenario for the profile, measure it (``repeats``
fresh launches), judge it against the baseline, confirm an apparent regression
by measuring again, and (on request) record or calibrate the baseline.

One PerfSession per pytest session. Results are memoised by scenario id, so a
relation check and the scenario's own test share a single measurement.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfsuite import definition
from perfsuite import metrics as registry
from perfsuite.baselines import BaselineEntry, BaselineError, BaselineStore
from perfsuite.ceilings import Ceilings
from perfsuite.compare import (
    Judgement,
    MetricCheck,
    check_metric,
    judge_imbalance,
    judge_metrics,
    judge_outcome,
    resolve_tolerances,
)
from perfsuite.contention import Quiet, contended, wait_for_quiet
from perfsuite.envs import CURRENT, PythonEnv, build_hint, parse_envs
from perfsuite.fingerprint import stack_changes, tracked_packages
from perfsuite.fitting import fit_to_hardware, launch_precondition
from perfsuite.launch import Launcher, LaunchOutcome, WorkerJob, devicelock
from perfsuite.launch.procs import launcher_env
from perfsuite.launch.torchrun import LocalTorchrun, Topology, TorchrunLauncher
from perfsuite.profiles import HardwareProfile
from perfsuite.progress import Progress
from perfsuite.protocol import RankJob
from perfsuite.relations import Relation, RelationOutcome, evaluate
from perfsuite.stats import ScenarioMetrics, Summary, aggregate, pool
from perfsuite.trustworthy import calibrated_tolerances, untrustworthy
from perfsuite.workloads.base import BaseScenario


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
    accept_oom: frozenset[str] = frozenset()  # scenario ids whose OOM may be recorded as expected
    envs: Mapping[str, PythonEnv] = field(default_factory=lambda: parse_envs([]))  # named interpreters
    device_wait_s: float = 600.0  # how long a launch waits for GPUs another run holds
    contention_retries: int = 2  # fresh measurements after a contended one, each after the host went quiet
    contention_wait_s: float = 60.0  # longest wait for a quiet host, per scenario
    contention_budget_s: float = 300.0  # longest waiting in all, per session


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


def no_extra_metrics(result: ScenarioResult, ceilings: Ceilings) -> dict[str, Any]:
    return {}


class PerfSession:
    """Runs and judges scenarios of any workload kind.

    ``compare`` judges one metric (the plugin routes it through
    ``pytest_perfsuite_compare_metric``); ``extra_metrics`` returns ungated
    extras for a finished result (``pytest_perfsuite_extra_metrics``, whose
    default implementation adds MFU, the datasheet fraction and the fraction
    of this session's measured ceilings).
    """

    def __init__(
        self,
        settings: RunSettings,
        fingerprint: dict[str, Any],
        launcher: Launcher,
        compare: Callable[[MetricCheck], MetricCheck] = check_metric,
        extra_metrics: Callable[[ScenarioResult, Ceilings], dict[str, Any]] = no_extra_metrics,
        progress: Progress | None = None,
    ) -> None:
        self.settings = settings
        self.progress = progress or Progress(None)
        self.fingerprint = fingerprint
        self.launcher = launcher
        self.compare = compare
        self.extra_metrics = extra_metrics
        self.store = BaselineStore(settings.baselines_dir, settings.profile.name)
        self._stores: dict[str, BaselineStore] = {CURRENT: self.store}
        self.results: dict[str, ScenarioResult] = {}
        self.relations: dict[str, RelationOutcome] = {}
        self.runtime: dict[str, Any] = {}  # rank 0's torch/CUDA/NCCL builds, once seen
        self.nodes: dict[str, dict[str, Any]] = {}  # host -> ranks seen there and its runtime
        self.ceilings = Ceilings()  # best matmul TFLOP/s per dtype measured so far
        self.env_runtime: dict[str, dict[str, Any]] = {}  # rank 0's builds per named environment
        self._emulators: dict[int, TorchrunLauncher] = {}
        #: Waits for a quiet host (tests replace it); seconds waited so far in this session.
        self.wait_for_quiet: Callable[[float, float, float], Quiet] = wait_for_quiet
        self.waited_s = 0.0
        self._workroot = settings.workdir or Path(tempfile.mkdtemp(prefix="perfsuite-"))

    @property
    def profile(self) -> HardwareProfile:
        return self.settings.profile

    def current_fingerprint(self, env: str = CURRENT) -> dict[str, Any]:
        fingerprint = {**self.fingerprint, "runtime": self.runtime}
        if len(self.nodes) > 1:
            fingerprint["nodes"] = self.nodes
        if env != CURRENT:
            # Another interpreter: its own Python and packages (the machine is the same).
            probed = self.settings.envs[env].probe(tracked_packages())
            fingerprint.update(probed, env=env, runtime=self.env_runtime.get(env, {}))
        return fingerprint

    def env_of(self, scenario: BaseScenario) -> str:
        return scenario.env or CURRENT

    def store_for(self, env: str) -> BaselineStore:
        """Baselines of ``env``: its own folder, ``<profile>@<env>``, so stacks never mix."""
        if env not in self._stores:
            self._stores[env] = BaselineStore(self.settings.baselines_dir, f"{self.profile.name}@{env}")
        return self._stores[env]

    def _note_nodes(self, outcome: LaunchOutcome, env: str = CURRENT) -> None:
        """Remember each node's runtime (reported by its local rank 0); another environment's apart."""
        if env != CURRENT:
            runtime = next((dict(r.runtime) for r in outcome.reports if r.rank == 0 and r.runtime), None)
            if runtime:
                self.env_runtime[env] = runtime
            return
        for report in outcome.reports:
            node = self.nodes.setdefault(report.host, {"ranks": []})
            if report.rank not in node["ranks"]:
                node["ranks"].append(report.rank)
            if report.runtime:
                node["runtime"] = dict(report.runtime)
                if report.rank == 0:
                    self.runtime = dict(report.runtime)

    def launcher_for(self, scenario: BaseScenario) -> Launcher:
        """The session's launcher, or for a multi-node scenario under the local
        launcher, torchrun agents emulating its nodes on this host (over loopback)."""
        nodes = scenario.nodes or 1
        if nodes == 1 or not isinstance(self.launcher, LocalTorchrun):
            return self.launcher
        if nodes not in self._emulators:
            self._emulators[nodes] = TorchrunLauncher(Topology(nnodes=nodes))
        return self._emulators[nodes]

    def _topology(self, scenario: BaseScenario) -> Topology | None:
        topology: Topology | None = getattr(self.launcher_for(scenario), "topology", None)
        return topology

    def launch_info(self, scenario: BaseScenario, measurement: Measurement) -> dict[str, Any]:
        """Launcher, nodes this scenario used (Slurm takes as many as it needs),
        ranks per host and how they started (``fork``, ``exec``: the profile's
        ``rank_start``, as the ranks saw it)."""
        launcher, topology = self.launcher_for(scenario), self._topology(scenario)
        reports = measurement.outcome.reports
        per_host: dict[str, int] = {}
        for report in reports:
            per_host[report.host] = per_host.get(report.host, 0) + 1
        started = sorted({"fork" if report.forked else "exec" for report in reports})
        return {
            "launcher": launcher.name,
            "nnodes": topology.layout(scenario.world_size)[0] if topology else 1,
            "ranks_per_host": per_host,
            "rank_start": "+".join(started) or None,
        }

    # -- scenarios ------------------------------------------------------------
    def run(self, scenario: BaseScenario) -> ScenarioResult:
        """Run (once per session) and judge ``scenario`` on this profile.

        Raises :class:`BaselineError` before launching anything if the
        scenario's baseline file is unusable.
        """
        if scenario.id not in self.results:
            self.results[scenario.id] = self._run(scenario.resolve(self.profile.variant_keys))
        return self.results[scenario.id]

    def _run(self, scenario: BaseScenario) -> ScenarioResult:
        scenario, skip = self._fit(scenario)
        if skip:
            return ScenarioResult(scenario, "skipped", Judgement("skipped", skip))
        baseline = self.store_for(self.env_of(scenario)).get(scenario.group, scenario.id)
        attempts: list[dict[str, Any]] = []
        measurement, judgement = self._measured(scenario, baseline, attempts)
        for _ in range(self.settings.confirm if judgement.verdict == "regression" else 0):
            # A regression must reproduce in a fresh measurement: noise rarely
            # strikes twice, so false alarms fall to about the square.
            measurement, judgement = self._measured(scenario, baseline, attempts)
            if judgement.verdict != "regression":
                judgement = _unconfirmed(judgement, attempts)
                break
        if judgement.verdict == "regression" and len(attempts) > 1:
            judgement = _confirmed(judgement, attempts, scenario.primary)
        result = ScenarioResult(
            scenario,
            measurement.status,
            judgement,
            measurement.metrics,
            baseline,
            measurement.outcome,
            attempts=attempts,
            launch_info=self.launch_info(scenario, measurement),
        )
        self.ceilings.offer(scenario.to_config(), result.status, _mean_or_none(result.metrics, "tflops"))
        result.extra_metrics.update(self.extra_metrics(result, self.ceilings))
        # A throttled run, or one that mostly skipped its updates, must not become the baseline.
        distrusted = measurement.metrics is not None and bool(untrustworthy(measurement.metrics))
        recordable = measurement.status in ("ok", "oom") and not distrusted
        if (self.settings.update_baselines or self.settings.calibrate) and recordable:
            result.judgement = self._refused_oom(scenario, result) or self._record(scenario, result)
        return result

    def _measured(self, scenario: BaseScenario, baseline: BaselineEntry | None,
                  attempts: list[dict[str, Any]]) -> tuple[Measurement, Judgement]:  # fmt: skip
        """Measure and judge once; a judgement that contention left unreliable waits for a
        quiet host and measures again, up to the settings' retries within the wait budgets.
        Every measurement goes into ``attempts``."""
        busy: list[str] = []
        while True:
            measurement = self.measure(scenario)
            judgement = self._judge(scenario, measurement, baseline)
            attempts.append(_attempt(scenario, measurement, judgement))
            why = self._contended(measurement.metrics) if measurement.metrics is not None else ""
            if judgement.verdict != "unreliable" or not why:
                break
            busy.append(why)
            waited = self._await_quiet() if len(busy) <= self.settings.contention_retries else None
            if waited is None or not waited.quiet:
                judgement = _still_contended(judgement, busy, waited, self.settings.contention_retries)
                break
        if busy and judgement.verdict != "unreliable":
            tries = "; ".join(f"try {n}: {why}" for n, why in enumerate(busy, 1))
            judgement = replace(
                judgement, message=f"{judgement.message} [measured again after the host went quiet; {tries}]"
            )
        return measurement, judgement

    def _await_quiet(self) -> Quiet | None:
        """Wait for the host to go quiet within what is left of the per-scenario and per-session
        budgets (None when nothing is left)."""
        budget = min(self.settings.contention_wait_s, self.settings.contention_budget_s - self.waited_s)
        if budget <= 0:
            return None
        quiet = self.wait_for_quiet(self.profile.max_foreign_cores, self.profile.max_steal_cores, budget)
        self.waited_s += quiet.waited_s
        return quiet

    def _refused_oom(self, scenario: BaseScenario, result: ScenarioResult) -> Judgement | None:
        """An OOM that neither the scenario nor its stored baseline expects is not recorded,
        unless ``--perf-accept-oom`` names it: recorded silently, the gate would pass that OOM from then on."""
        if result.status != "oom" or scenario.id in self.settings.accept_oom:
            return None
        stored = result.baseline is not None and result.baseline.expected == "oom"
        if stored or scenario.expected_outcome(self.profile.variant_keys) == "oom":
            return None
        return Judgement(
            "unexpected_oom",
            "ran out of memory where it should fit, so no baseline was recorded (the stored one is unchanged). "
            f"If the new footprint is intended, record the OOM as expected: --perf-update-baselines "
            f"--perf-accept-oom {scenario.id}",
        )

    def _precondition(self, scenario: BaseScenario, env: str | None = None) -> str:
        env = env or self.env_of(scenario)
        if env not in self.settings.envs:
            return f"environment {env!r} is not given{build_hint(env)}"
        missing = self.settings.envs[env].missing()
        if missing:
            return missing
        return launch_precondition(scenario, self.profile, self.fingerprint, self._topology(scenario))

    def prepare(self, scenario: BaseScenario) -> tuple[BaseScenario, str]:
        """``scenario`` as this profile and machine run it, and why it must skip ("" if it can run)."""
        return self._fit(scenario.resolve(self.profile.variant_keys))

    def _fit(self, resolved: BaseScenario) -> tuple[BaseScenario, str]:
        """A resolved scenario at the world size the hardware holds, and why it must skip ("" if it can run)."""
        fitted = fit_to_hardware(resolved, self.profile, self.fingerprint, self._topology(resolved))
        return fitted, self._precondition(fitted)

    def launch_once(
        self, scenario: BaseScenario, env: str, slowdown_pct: float = 0.0
    ) -> tuple[str, dict[str, float], str, str]:
        """One fresh launch of a prepared scenario in ``env``: status, each metric's value, failure
        message, and why it was measured under contention ("" if it was not)."""
        skip = self._precondition(scenario, env)
        if skip:
            return "skipped", {}, skip, ""
        measurement = self.measure(scenario, env, slowdown_pct, repeats=1)
        metrics, outcome = measurement.metrics, measurement.outcome
        if metrics is None:
            failure = outcome.skip_reason or (outcome.failure.describe() if outcome.failure else "")
            return outcome.status, {}, failure, ""
        return "ok", {name: metrics.value(name) for name in metrics.values}, "", self._contended(metrics)

    def measure(
        self, scenario: BaseScenario, env: str | None = None, slowdown_pct: float | None = None, repeats: int = 0
    ) -> Measurement:
        """``repeats`` (default: the session's) fresh launches of a prepared scenario in ``env``
        (default: its own), pooled; nothing judged or recorded."""
        env = env or self.env_of(scenario)
        launches: list[LaunchOutcome] = []
        runs: list[ScenarioMetrics] = []
        work = scenario.step_work()
        for _ in range(repeats or self.settings.repeats):
            job = self._job(scenario, env, slowdown_pct)
            with self._devices_held(scenario), self.progress.watch(scenario.id, job.reports_dir):
                outcome = self.launcher_for(scenario).run(job)
            launches.append(outcome)
            self._note_nodes(outcome, env)
            if outcome.status != "ok":
                return Measurement(tuple(launches), None)
            runs.append(aggregate(outcome.reports, work, scenario.metrics))
        return Measurement(tuple(launches), pool(runs, scenario.metrics))

    def _devices_held(self, scenario: BaseScenario) -> contextlib.AbstractContextManager[None]:
        """This host's GPUs, held for one launch so that no other run measures on
        them meanwhile (:mod:`perfsuite.launch.devicelock`); nothing on cpu."""
        if self.profile.device != "cuda":
            return contextlib.nullcontext()
        return devicelock.hold(self._gpu_labels(), scenario.id, self.settings.device_wait_s, say=_say)

    def _gpu_labels(self) -> tuple[str, ...]:
        """This host's GPUs as NVML labels them (index, or UUID under CUDA_VISIBLE_DEVICES)."""
        return tuple(str(gpu["index"]) for gpu in self.fingerprint.get("gpus") or [])

    def _job(self, scenario: BaseScenario, env: str = CURRENT, slowdown_pct: float | None = None) -> WorkerJob:
        workdir = Path(tempfile.mkdtemp(prefix=f"{scenario.id}-", dir=self._workroot))
        timeout = self.settings.timeout_s or scenario.timeout_s or self.profile.timeout_s
        rank_job = RankJob(
            spec=scenario.rank_spec(),
            device=self.profile.device,
            reports_dir=str(workdir / "reports"),
            rank_memory_budget_mib=self.profile.rank_memory_budget_mib,
            device_memory_cap_mib=self.profile.device_memory_cap_mib,
            steady_threshold=self.profile.steady_threshold,
            slowdown_pct=self.settings.slowdown_pct if slowdown_pct is None else slowdown_pct,
            reference_mib=self.profile.reference_mib,
        )
        topology = self._topology(scenario)
        per_node = topology.ranks_per_node(scenario.world_size) if topology else None
        python = self.settings.envs[env]
        worker_env = {
            **self.settings.worker_env,
            **({} if python.is_current else python.worker_env()),
            **launcher_env(),  # ranks exit if this process dies, even by SIGKILL
        }
        return WorkerJob(
            rank_job,
            scenario.world_size,
            timeout,
            workdir,
            worker_env,
            per_node,
            self._gpu_labels(),
            python.python,
            rank_start=self.profile.rank_start or "exec",  # resolved by the profile; never None
        )

    # -- judgement ------------------------------------------------------------
    def _judge(self, scenario: BaseScenario, measurement: Measurement, baseline: BaselineEntry | None) -> Judgement:
        outcome, metrics = measurement.outcome, measurement.metrics
        if outcome.status == "skipped":
            return Judgement("skipped", outcome.skip_reason)
        if outcome.status in ("crash", "timeout"):
            detail = outcome.failure.describe() if outcome.failure else ""
            return Judgement("error", f"workers {outcome.status}: {detail}")
        redefined = self._redefined(scenario, baseline)
        if redefined is not None:
            return redefined
        expected = baseline.expected if baseline else scenario.expected_outcome(self.profile.variant_keys)
        decided = judge_outcome(outcome.status, expected, baseline)
        if (decided is not None and decided.verdict != "no_baseline") or metrics is None:
            return decided or Judgement("error", "no metrics")
        distrust = untrustworthy(metrics)
        if distrust:
            return Judgement("unreliable", distrust)
        if decided is not None or baseline is None:
            return decided or Judgement("no_baseline", "no baseline recorded")
        changes = tuple(stack_changes(dict(baseline.fingerprint), self.current_fingerprint(self.env_of(scenario))))
        busy = self._contended(metrics)
        primary = metrics.summary(scenario.primary)
        if primary is not None and primary.cv > self.profile.max_cv:
            # Name the contention when it was measured: it is the likely cause of the spread.
            cause = f"measured under contention ({busy})" if busy else "busy or throttled machine?"
            return Judgement(
                "unreliable",
                f"{scenario.primary} varies too much to judge: CV {primary.cv:.1%} over this "
                f"profile's limit {self.profile.max_cv:.0%} ({cause})",
                stack_changes=changes,
            )
        tolerances = resolve_tolerances(self._defaults(scenario), scenario.tolerances, baseline)
        judgement = judge_metrics(metrics, baseline, tolerances, self.compare, scenario.metrics)
        if judgement.verdict == "regression" and busy:
            return Judgement(
                "unreliable",
                f"measured under contention ({busy}), so not judged a regression: {judgement.message}",
                judgement.checks,
                changes,
            )
        if judgement.verdict != "regression":
            judgement = judge_imbalance(metrics, scenario.max_imbalance) or judgement
        return Judgement(judgement.verdict, judgement.message, judgement.checks, changes)

    def _redefined(self, scenario: BaseScenario, baseline: BaselineEntry | None) -> Judgement | None:
        """``definition_changed`` when the scenario is no longer what its baseline was recorded for
        (None when it is, or when the baseline predates stored definitions)."""
        recorded = baseline.extra.get("definition") if baseline is not None else None
        if not isinstance(recorded, Mapping):
            return None
        changed = definition.changes(recorded, definition.definition(scenario.to_config()))
        if not changed:
            return None
        return Judgement(
            "definition_changed",
            f"the scenario changed since its baseline was recorded ({'; '.join(changed)}), so its figures are "
            f"not comparable; re-record it: pytest -k '{scenario.id}' --perf-update-baselines",
        )

    @functools.cached_property
    def provenance(self) -> dict[str, Any]:
        """perfsuite's version and the checkout's commit, read once per session."""
        return definition.provenance(self.settings.baselines_dir.parent)

    def _contended(self, metrics: ScenarioMetrics) -> str:
        """Why ``metrics`` were measured under contention by this profile's limits ("" if they were not)."""
        return contended(metrics.contention, self.profile.max_foreign_cores, self.profile.max_steal_cores)

    def _defaults(self, scenario: BaseScenario) -> dict[str, float]:
        return self.profile.default_tolerances(scenario.metrics)

    # -- baselines ------------------------------------------------------------
    def _record(self, scenario: BaseScenario, result: ScenarioResult) -> Judgement:
        metrics: dict[str, Any] = {}
        tolerances: dict[str, float] | None = None
        extra: dict[str, Any] = {}
        if result.status == "oom" and scenario.id in self.settings.accept_oom:
            extra["oom_accepted"] = {"by": _who(), "at": _now(), "via": "--perf-accept-oom"}
        extra["definition"] = definition.definition(scenario.to_config())
        extra["provenance"] = self.provenance
        if result.metrics is not None:
            metrics = baseline_metrics(result.metrics)
            if self.settings.calibrate:
                tolerances, extra["calibration"] = calibrated_tolerances(
                    result.metrics, self._defaults(scenario), self.profile.calibration_floor_of
                )
        store = self.store_for(self.env_of(scenario))
        entry = store.record(
            scenario.group,
            scenario.id,
            result.status,
            metrics,
            self.current_fingerprint(self.env_of(scenario)),
            tolerances=tolerances,
            extra=extra,
        )
        result.baseline = entry
        what = "baseline and calibrated tolerances" if tolerances else "baseline"
        return Judgement("recorded", f"{what} recorded in {store.path(scenario.group)}")

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
        return evaluate(relation, left, right)


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


def _attempt(scenario: BaseScenario, measurement: Measurement, judgement: Judgement) -> dict[str, Any]:
    stored = baseline_metrics(measurement.metrics) if measurement.metrics else {}
    return {
        "status": measurement.status,
        "verdict": judgement.verdict,
        "message": judgement.message,
        **{name: stored.get(name) for name in scenario.metrics},
    }


def _confirmed(judgement: Judgement, attempts: list[dict[str, Any]], primary: str) -> Judgement:
    seen = ", ".join(f"{_mean(a[primary]):.4g}" for a in attempts if a[primary] is not None)
    note = f" [confirmed by {len(attempts) - 1} fresh measurement(s); {primary} per measurement: {seen}]"
    return Judgement(judgement.verdict, judgement.message + note, judgement.checks, judgement.stack_changes)


def _mean_or_none(metrics: ScenarioMetrics | None, name: str) -> float | None:
    return metrics.value(name) if metrics is not None and name in metrics.values else None


def _mean(stored: Any) -> float:
    return float(stored["mean"] if isinstance(stored, dict) else stored)


def _still_contended(judgement: Judgement, busy: list[str], waited: Quiet | None, retries: int) -> Judgement:
    """An unreliable verdict that names the contention of every try and why it stopped trying."""
    if waited is not None:
        last = f"{waited.last.foreign_cores:.2f} cores busy" if waited.last else "no sample"
        stop = f"the host did not go quiet within {waited.waited_s:.0f} s ({last})"
    elif len(busy) > retries:
        stop = f"all {len(busy)} measurement(s) contended (--perf-contention-retries {retries})"
    else:
        stop = "the session's wait budget for a quiet host is spent (--perf-contention-budget)"
    tries = "; ".join(f"try {n}: {why}" for n, why in enumerate(busy, 1))
    return replace(judgement, message=f"{judgement.message} [{stop}; {tries}]")


def _unconfirmed(judgement: Judgement, attempts: list[dict[str, Any]]) -> Judgement:
    first = next(a for a in attempts if a["verdict"] == "regression")
    if judgement.verdict == "unreliable":  # the confirmation could not be judged: neither noise nor a regression
        outcome = "could not be judged, so neither is"
    else:
        outcome = "did not reproduce it: treated as noise"
    note = (
        f"a measurement looked like a regression ({first['message']}) but confirmation "
        f"measurement {len(attempts) - 1} {outcome}. "
    )
    return Judgement(judgement.verdict, note + judgement.message, judgement.checks, judgement.stack_changes)


__all__ = ["BaselineError", "PerfSession", "RunSettings", "ScenarioResult"]


def _who() -> str:
    """Who accepted something into a baseline: the login, and the CI job where there is one."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = f"uid {os.getuid()}"
    job = os.environ.get("GITHUB_RUN_ID") or os.environ.get("CI_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    return f"{user} (job {job})" if job else user


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def _say(message: str) -> None:
    """Tell the user now, past pytest's output capture (a wait can be minutes)."""
    print(message, file=sys.__stderr__, flush=True)
