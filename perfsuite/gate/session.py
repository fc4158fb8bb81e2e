"""Orchestration: resolve a scenario for the profile, measure it (``repeats``
fresh launches), judge it against the baseline, confirm an apparent regression
by measuring again, and (on request) record or calibrate the baseline.

One PerfSession per pytest session. Results are memoised by scenario id, so a
relation check and the scenario's own test share a single measurement.

The session decides what happens in which order; the work is elsewhere:
launches in :mod:`perfsuite.gate.launching`, verdicts and their notes in
:mod:`perfsuite.judge.judging`, baseline entries in :mod:`perfsuite.gate.recording`, the
values they pass around in :mod:`perfsuite.judge.results` and
:mod:`perfsuite.gate.settings`. Those names are re-exported here, where the plugin,
the run modes and user code have always imported them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.relations import Relation, RelationOutcome, evaluate
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.gate import recording
from perfsuite.gate.fitting import Fit, fit, launch_precondition
from perfsuite.gate.launching import Launches
from perfsuite.gate.profiling import OpProfiles
from perfsuite.gate.settings import RunSettings
from perfsuite.gate.work import WorkGate, counted
from perfsuite.judge import definition, judging
from perfsuite.judge.ceilings import Ceilings
from perfsuite.judge.compare import FAILING, FamilyFloor, Judgement, MetricCheck, Note, check_metric
from perfsuite.judge.contention import Quiet, wait_for_quiet
from perfsuite.judge.explain import Explanation
from perfsuite.judge.results import (
    Measurement,
    OneLaunch,
    ScenarioResult,
    attempt,
    baseline_metrics,
    no_extra_metrics,
)
from perfsuite.judge.stats import ScenarioMetrics
from perfsuite.judge.trustworthy import untrustworthy
from perfsuite.judge.work import applied
from perfsuite.launch import Launcher
from perfsuite.launch.envs import CURRENT, build_hint
from perfsuite.launch.fingerprint import tracked_packages
from perfsuite.launch.progress import Progress
from perfsuite.store.baselines import BaselineEntry, BaselineError, BaselineStore

__all__ = [
    "BaselineError",
    "Measurement",
    "PerfSession",
    "RunSettings",
    "ScenarioResult",
    "baseline_metrics",
    "no_extra_metrics",
]


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
        self.fingerprint = fingerprint
        self.compare = compare
        self.extra_metrics = extra_metrics
        #: Builds and runs each launch, and keeps what the ranks reported about their nodes.
        self.launches = Launches(settings, fingerprint, launcher, progress or Progress(None))
        #: The profiled launches that explain a regression or an OOM, and the stored op profiles.
        self.op_profiles = OpProfiles(settings, self.launches, self._processor)
        #: Each launch's counted step work, judged against the counts recorded beside the baselines.
        self.work = WorkGate(settings.baselines_dir)
        # On cpu, this processor's entries (HardwareProfile.entry_processor): several live side by side.
        self.store = BaselineStore(settings.baselines_dir, settings.profile.name, self._processor)
        self._stores: dict[str, BaselineStore] = {CURRENT: self.store}
        self.results: dict[str, ScenarioResult] = {}
        self.relations: dict[str, RelationOutcome] = {}
        self.ceilings = Ceilings()  # best matmul TFLOP/s per dtype measured so far
        #: Waits for a quiet host (tests replace it); seconds waited so far in this session.
        self.wait_for_quiet: Callable[[float, float, float], Quiet] = wait_for_quiet
        self.waited_s = 0.0

    # The launches own these; the session's attributes stay where callers read them.
    @property
    def launcher(self) -> Launcher:
        return self.launches.launcher

    @launcher.setter
    def launcher(self, launcher: Launcher) -> None:
        self.launches.launcher = launcher  # tests swap the launcher between runs

    @property
    def runtime(self) -> dict[str, Any]:
        """Rank 0's torch/CUDA/NCCL builds, once seen."""
        return self.launches.runtime

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Host -> ranks seen there and its runtime."""
        return self.launches.nodes

    @property
    def env_runtime(self) -> dict[str, dict[str, Any]]:
        """Rank 0's builds per named environment."""
        return self.launches.env_runtime

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

    @property
    def _processor(self) -> Mapping[str, Any] | None:
        """Whose baseline entries this session reads and records (the machine is the same in every env)."""
        return self.settings.profile.entry_processor(self.fingerprint)

    def env_of(self, scenario: BaseScenario) -> str:
        return scenario.env or CURRENT

    def store_for(self, env: str) -> BaselineStore:
        """Baselines of ``env``: its own folder, ``<profile>@<env>``, so stacks never mix."""
        if env not in self._stores:
            folder = f"{self.profile.name}@{env}"
            self._stores[env] = BaselineStore(self.settings.baselines_dir, folder, self._processor)
        return self._stores[env]

    @functools.cached_property
    def provenance(self) -> dict[str, Any]:
        """perfsuite's version and the checkout's commit, read once per session."""
        return definition.provenance(self.settings.baselines_dir.parent)

    def launch_info(self, scenario: BaseScenario, measurement: Measurement) -> dict[str, Any]:
        """Launcher, nodes this scenario used, ranks per host and how they started."""
        return self.launches.info(scenario, measurement)

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
        fitted = self._fit(scenario)
        if fitted.skip is not None:
            return ScenarioResult(fitted.scenario, "skipped", Judgement("skipped", fitted.skip), missing=fitted.missing)
        scenario = fitted.scenario
        env = self.env_of(scenario)
        baseline = self.store_for(env).get(scenario.group, scenario.id)
        attempts: list[dict[str, Any]] = []
        measurement, judgement = self._measured(scenario, baseline, attempts)
        for _ in range(self.settings.confirm if judgement.verdict == "regression" else 0):
            # A regression must reproduce in a fresh measurement: noise rarely
            # strikes twice, so false alarms fall to about the square.
            measurement, judgement = self._measured(scenario, baseline, attempts)
            if judgement.verdict != "regression":
                judgement = judging.unconfirmed(judgement, attempts)
                break
        if judgement.verdict == "regression" and len(attempts) > 1:
            judgement = judging.confirmed(judgement, attempts, scenario.primary)
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
        self._judge_work(scenario, result, measurement)
        self._explain(scenario, result)
        # A throttled run, or one that mostly skipped its updates, must not become the baseline.
        distrusted = measurement.metrics is not None and untrustworthy(measurement.metrics) is not None
        recordable = measurement.status in ("ok", "oom") and not distrusted
        if (self.settings.update_baselines or self.settings.calibrate) and recordable:
            result.judgement = self._record(scenario, result)
        return result

    def _measured(
        self, scenario: BaseScenario, baseline: BaselineEntry | None, attempts: list[dict[str, Any]]
    ) -> tuple[Measurement, Judgement]:
        """Measure and judge once; a judgement that contention left unreliable waits for a
        quiet host and measures again, up to the settings' retries within the wait budgets.
        Every measurement goes into ``attempts``."""
        busy: list[str] = []
        while True:
            measurement = self.measure(scenario, count_work=self.settings.count_work)
            judgement = self._judge(scenario, measurement, baseline)
            attempts.append(attempt(scenario, measurement, judgement))
            why = self._contended(measurement.metrics)
            if judgement.verdict != "unreliable" or why is None:
                break
            busy.append(why)
            waited = self._await_quiet() if len(busy) <= self.settings.contention_retries else None
            if waited is None or not waited.quiet:
                judgement = judging.still_contended(judgement, busy, waited, self.settings.contention_retries)
                break
        if busy and judgement.verdict != "unreliable":
            judgement = judging.remeasured(judgement, busy)
        return measurement, judgement

    def _judge(self, scenario: BaseScenario, measurement: Measurement, baseline: BaselineEntry | None) -> Judgement:
        env = self.env_of(scenario)
        return judging.judge(
            scenario,
            measurement,
            baseline,
            self.profile,
            self.compare,
            lambda: self.current_fingerprint(env),
            self._family_floor(baseline),
        )

    def _family_floor(self, baseline: BaselineEntry | None) -> FamilyFloor | None:
        """The floor a row's timing is judged with in this run of ``family_rows`` timing-judged rows."""
        if baseline is None or self.family_rows <= 1:
            return None
        from perfsuite.judge.simulate.family import floor_for  # numpy and scipy: only for a run of several rows

        return floor_for(baseline, self.profile, self.family_rows)

    @functools.cached_property
    def family_rows(self) -> int:
        """The selected rows with this processor's own baseline: those whose timing the run judges,
        which together may raise at most ``FAMILY_ALPHA`` false alarms a run (at least 1)."""
        counted = 0
        for scenario_id in self.settings.selected:
            group = scenario_id.partition(".")[0]
            counted += self.store.own(group, scenario_id) is not None
        return max(1, counted)

    def _record(self, scenario: BaseScenario, result: ScenarioResult) -> Judgement:
        """Record ``result`` as the scenario's baseline, unless it is an OOM nothing expects."""
        env = self.env_of(scenario)
        refused = recording.refused_oom(scenario, result, self.settings)
        if refused is not None:
            return refused
        fingerprint = functools.partial(self.current_fingerprint, env)
        store = self.store_for(env)
        judgement = recording.record(scenario, result, store, self.settings, self.provenance, fingerprint)
        if result.status == "ok" and self.settings.count_work:
            packages = self.current_fingerprint(env).get("packages", {})
            judgement = judgement.noted(
                Note("work", self.work.record(scenario, store.profile, result.work_count, packages), "clause")
            )
        if result.status != "ok" or self.settings.op_profiles == "off":
            return judgement
        # One more launch, after the measured ones: the op profile a later regression is diffed against.
        return judgement.noted(Note("op_profile", self.op_profiles.record(scenario, env, store.profile), "clause"))

    def _judge_work(self, scenario: BaseScenario, result: ScenarioResult, measurement: Measurement) -> None:
        """The step's counted work against the recorded counts (``--perf-work``), into ``result``."""
        if not self.settings.count_work or measurement.status != "ok":
            return
        env = self.env_of(scenario)
        result.work_count = counted(measurement)
        packages = self.current_fingerprint(env).get("packages", {})
        result.work = self.work.judge(scenario, self.store_for(env).profile, result.work_count, packages)
        if not (self.settings.update_baselines or self.settings.calibrate):
            result.judgement = applied(result.judgement, result.work)

    def _explain(self, scenario: BaseScenario, result: ScenarioResult) -> None:
        """Say why, with one more, profiled launch: which ops a regression grew (``always``: any measured
        scenario), or which allocations an OOM that fails (on CUDA: any OOM) had made."""
        mode, judgement, env = self.settings.op_profiles, result.judgement, self.env_of(scenario)
        if mode == "off":
            return
        if result.status == "oom" and (judgement.verdict in FAILING or self.profile.device == "cuda"):
            note = self.op_profiles.allocations(scenario, env)
            result.judgement = judgement.noted(Note("op_profile", note, "line_after"))
            return
        recording_now = self.settings.update_baselines or self.settings.calibrate
        wanted = judgement.verdict == "regression" or (mode == "always" and result.status == "ok")
        if not wanted or recording_now:
            return
        found = self.op_profiles.explain(scenario, env, self.store_for(env).profile)
        if isinstance(found, Explanation):
            result.explanation = found
            failed = [c.metric for c in judgement.checks if c.outcome == "regression"]
            found = found.lead(memory=bool(failed) and scenario.primary not in failed)
        if judgement.verdict == "regression":
            result.judgement = judgement.noted(Note("op_profile", found, "line_before"))

    def _contended(self, metrics: ScenarioMetrics | None) -> str | None:
        """Why ``metrics`` were measured under contention (None if they were not, or there are none)."""
        return judging.contention_of(metrics, self.profile) if metrics is not None else None

    def _await_quiet(self) -> Quiet | None:
        """Wait for the host to go quiet within what is left of the per-scenario and per-session
        budgets (None when nothing is left)."""
        budget = min(self.settings.contention_wait_s, self.settings.contention_budget_s - self.waited_s)
        if budget <= 0:
            return None
        quiet = self.wait_for_quiet(self.profile.max_foreign_cores, self.profile.max_steal_cores, budget)
        self.waited_s += quiet.waited_s
        return quiet

    def _precondition(self, scenario: BaseScenario, env: str | None = None) -> str | None:
        """Why a prepared ``scenario`` cannot launch in ``env`` (default: its own) here (None if it can)."""
        problem = self._env_problem(env or self.env_of(scenario))
        if problem is not None:
            return problem
        return launch_precondition(scenario, self.profile, self.fingerprint, self.launches.topology(scenario))

    def _env_problem(self, env: str) -> str | None:
        """Why the Python environment ``env`` cannot run scenarios here (None if it can)."""
        if env not in self.settings.envs:
            return f"environment {env!r} is not given{build_hint(env)}"
        return self.settings.envs[env].missing()

    def prepare(self, scenario: BaseScenario) -> Fit:
        """``scenario`` as this profile and machine run it, and why it must skip."""
        return self._fit(scenario.resolve(self.profile.variant_keys))

    def _fit(self, resolved: BaseScenario) -> Fit:
        """A resolved scenario at the world size the hardware holds, and why it must skip."""
        topology = self.launches.topology(resolved)  # by its node count, which fitting keeps
        return fit(resolved, self.profile, self.fingerprint, topology, self._env_problem(self.env_of(resolved)))

    def launch_once(self, scenario: BaseScenario, env: str, slowdown_pct: float = 0.0) -> OneLaunch:
        """One fresh launch of a prepared scenario in ``env``, nothing judged or recorded."""
        skip = self._precondition(scenario, env)
        if skip is not None:
            return OneLaunch("skipped", {}, skip)
        measurement = self.measure(scenario, env, slowdown_pct, repeats=1)
        metrics, outcome = measurement.metrics, measurement.outcome
        if metrics is None:
            failure = outcome.skip_reason or (outcome.failure.describe() if outcome.failure else "")
            return OneLaunch(outcome.status, {}, failure)
        values = {name: metrics.value(name) for name in metrics.values}
        return OneLaunch("ok", values, contended=self._contended(metrics))

    def measure(
        self,
        scenario: BaseScenario,
        env: str | None = None,
        slowdown_pct: float | None = None,
        repeats: int = 0,
        count_work: bool = False,
    ) -> Measurement:
        """``repeats`` (default: the session's) fresh launches of a prepared scenario in ``env``
        (default: its own), pooled; nothing judged or recorded. ``count_work``: with each step's
        counted work (the gate's own measurements; an A/B's launches compare timing only)."""
        return self.launches.measure(scenario, env or self.env_of(scenario), slowdown_pct, repeats, count_work)

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


def _mean_or_none(metrics: ScenarioMetrics | None, name: str) -> float | None:
    return metrics.value(name) if metrics is not None and name in metrics.values else None
