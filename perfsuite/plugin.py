"""pytest integration: options, the ``perf`` fixture, the summary and the results file.

Loaded through the ``pytest11`` entry point. Every scenario is its own test: the
verdict fails, skips or passes *that* test, never a session hook.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from perfsuite import abtest, gate, guards, hookspecs, machine, maxbatch, options
from perfsuite.baselines import BaselineError
from perfsuite.ceilings import Ceilings, ceilings_first
from perfsuite.compare import FAILING, MetricCheck, check_metric
from perfsuite.cost import ranking, ranking_lines
from perfsuite.coverage import Coverage
from perfsuite.envs import PythonEnv
from perfsuite.launch import Launcher
from perfsuite.launch.devicelock import DeviceBusy
from perfsuite.progress import Progress
from perfsuite.relations import Relation, RelationOutcome
from perfsuite.report import (
    ResultsWriteError,
    relation_lines,
    results_document,
    summary_lines,
    write_results,
)
from perfsuite.session import PerfSession, RunSettings, ScenarioResult
from perfsuite.workloads.base import BaseScenario

SESSION_KEY = pytest.StashKey["PerfSession"]()
ENVS_KEY = pytest.StashKey[dict[str, PythonEnv]]()
LAUNCHER_KEY = pytest.StashKey[Launcher]()

# perfsuite's default extra metrics and its exporters are pytest plugins of
# their own: each implements a perfsuite hook (pytest_perfsuite_extra_metrics,
# pytest_perfsuite_session_finished) as a user's plugin would, and the
# exporters add their options to the perfsuite group.
pytest_plugins: list[str] = ["perfsuite.extras", "perfsuite.exports.benchjson", "perfsuite.exports.history"]


class StaleBaselineWarning(UserWarning):
    """A scenario beat its baseline by more than the tolerance."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perfsuite: a perfsuite benchmark scenario")
    options.check_options(config)
    config.stash[ENVS_KEY] = abtest.check_options(config)
    if config.getoption("--perf-profile"):
        machine.profile(config)  # fail fast on an unknown profile name
    config.stash[LAUNCHER_KEY] = machine.launcher(config)  # e.g. slurm outside an allocation


def _compare(config: pytest.Config) -> Any:
    def compare(check: MetricCheck) -> MetricCheck:
        custom = config.hook.pytest_perfsuite_compare_metric(check=check)
        return custom if custom is not None else check_metric(check)

    return compare


def _extra_metrics(config: pytest.Config) -> Any:
    def extra(result: ScenarioResult, ceilings: Ceilings) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for found in config.hook.pytest_perfsuite_extra_metrics(
            result=result, fingerprint=machine.fingerprint(config), profile=machine.profile(config), ceilings=ceilings
        ):
            merged.update(found or {})
        return merged

    return extra


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Ceiling-setting microbenchmarks run first, so every later training
    result can be set against this session's measured best (perfsuite.ceilings)."""
    items[:] = ceilings_first(items)


def _worker_env(config: pytest.Config) -> dict[str, str]:
    # Workers import scenario-supplied strategy modules from the project, as the
    # pytest process can: put rootdir and the invocation dir on their path.
    paths = [str(config.rootpath), str(config.invocation_params.dir)]
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([*paths, *([existing] if existing else [])])}


@pytest.fixture(scope="session")
def perf_session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PerfSession:
    """The run's PerfSession (profile, baselines, results so far)."""
    config = request.config
    if SESSION_KEY not in config.stash:
        baselines = config.getoption("--perf-baselines")
        envs: dict[str, PythonEnv] = config.stash[ENVS_KEY]
        settings = RunSettings(
            profile=machine.profile(config),
            baselines_dir=Path(baselines) if baselines else config.rootpath / "baselines",
            update_baselines=config.getoption("--perf-update-baselines"),
            timeout_s=config.getoption("--perf-timeout"),
            workdir=tmp_path_factory.mktemp("perfsuite"),
            worker_env=_worker_env(config),
            repeats=config.getoption("--perf-repeats"),
            confirm=config.getoption("--perf-confirm"),
            slowdown_pct=config.getoption("--perf-inject-slowdown"),
            calibrate=config.getoption("--perf-calibrate"),
            accept_oom=frozenset(config.getoption("--perf-accept-oom")),
            envs=envs,
            device_wait_s=config.getoption("--perf-device-wait"),
            **gate.contention_settings(config),
        )
        guards.check_xdist(config)
        guards.check_gpus_idle(config)
        gate.load_quarantine(config, settings.baselines_dir, settings.profile.name)
        request.addfinalizer(guards.stop_on_sigterm())
        launcher = config.stash[LAUNCHER_KEY]
        config.stash[SESSION_KEY] = PerfSession(
            settings, machine.fingerprint(config), launcher, _compare(config), _extra_metrics(config), _progress(config)
        )
    return config.stash[SESSION_KEY]


def _progress(config: pytest.Config) -> Progress:
    """The live line goes to a terminal only, and not under -q."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.get_verbosity() < 0 or not reporter.isatty():
        return Progress(None)
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(text: str) -> None:
        # During a test pytest captures fd 1; step past it as live logging does.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write(text, flush=True)  # raw: no newline

    return Progress(write, width=shutil.get_terminal_size().columns)


class Perf:
    """What a benchmark test uses: ``perf.check(scenario)``."""

    def __init__(self, session: PerfSession, request: pytest.FixtureRequest) -> None:
        self.session = session
        self.request = request

    def run(self, scenario: BaseScenario) -> ScenarioResult:
        """Run and judge ``scenario`` without deciding the test's outcome."""
        try:
            return self.session.run(scenario)
        except (BaselineError, DeviceBusy) as exc:
            pytest.fail(f"{scenario.id}: {exc}", pytrace=False)

    def check(self, scenario: BaseScenario) -> ScenarioResult | None:
        """Run ``scenario`` and pass, fail or skip this test by its verdict.

        Under ``--perf-find-max-batch`` it searches the largest micro-batch that
        fits instead (no baseline involved) and returns None.
        """
        if maxbatch.enabled(self.request.config):
            maxbatch.find_max_batch(self.session, scenario, self.request.config)
            return None
        if abtest.enabled(self.request.config):
            abtest.check(self.session, scenario, self.request.config)
            return None
        result = self.run(scenario)
        verdict, message = result.verdict, result.judgement.message
        if result.judgement.stack_changes:
            message += "\nstack changed since the baseline: " + "; ".join(result.judgement.stack_changes)
        held = gate.quarantined(self.request.config, scenario.id)
        if held is not None and verdict not in ("pass", "recorded", "expected_oom"):
            pytest.skip(f"{scenario.id}: QUARANTINED, not gating ({held.describe()}); {verdict}: {message}")
        if verdict in FAILING:
            pytest.fail(f"{scenario.id}: {verdict}: {message}", pytrace=False)
        if verdict == "skipped":
            pytest.skip(f"{scenario.id}: {message}")
        if verdict == "unreliable":
            if self.request.config.getoption(gate.DEPRECATED_FLAG):
                pytest.fail(f"{scenario.id}: UNRELIABLE: {message}", pytrace=False)
            pytest.skip(f"{scenario.id}: UNRELIABLE (not judged, fails the run): {message}")
        if verdict == "no_baseline":
            path = self.session.store_for(self.session.env_of(scenario)).path(scenario.group)
            pytest.skip(
                f"{scenario.id}: no baseline in {path} (not judged, fails the run); record one with: "
                f"pytest '{self.request.node.nodeid}' --perf-update-baselines"
            )
        if verdict == "improved":
            warnings.warn(StaleBaselineWarning(f"{scenario.id}: {message}"), stacklevel=2)
        return result

    def check_relation(self, relation: Relation) -> RelationOutcome:
        """Check a relation between two scenarios of this run; fail if violated."""
        if maxbatch.enabled(self.request.config):
            pytest.skip(
                f"{relation.id}: relations compare scenarios measured at their own batch; "
                f"{maxbatch.FLAG} only searches batch sizes, so none is checked"
            )
        if abtest.enabled(self.request.config):
            pytest.skip(f"{relation.id}: {abtest.FLAG} compares two environments, not scenarios with each other")
        try:
            outcome = self.session.relation(relation)
        except BaselineError as exc:
            pytest.fail(str(exc), pytrace=False)
        if outcome.status == "skipped":
            pytest.skip(f"{relation.id}: {outcome.message}")
        if outcome.status == "violated":
            pytest.fail(f"{relation.id}: violated: {outcome.message}", pytrace=False)
        return outcome


@pytest.fixture
def perf(perf_session: PerfSession, request: pytest.FixtureRequest) -> Perf:
    """Run perfsuite scenarios from a test: ``perf.check(scenario)``."""
    return Perf(perf_session, request)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if maxbatch.enabled(config):
        _max_batch_summary(terminalreporter, config)
    if abtest.results_of(config):
        terminalreporter.write_sep("-", f"perfsuite A/B ({config.getoption(abtest.FLAG)})")
        for line in abtest.summary_lines(abtest.results_of(config)):
            terminalreporter.write_line(line)
    session = config.stash.get(SESSION_KEY, None)
    if session is not None and session.results:
        _session_summary(terminalreporter, config, session)
    found = _coverage(config)
    failing = gate.problems(config, found)
    if found is not None:
        gate.summary(terminalreporter, found, failing)
    else:
        for line in failing:
            terminalreporter.write_line(line, red=True)


def _session_summary(terminalreporter: Any, config: pytest.Config, session: PerfSession) -> None:
    terminalreporter.write_sep("-", f"perfsuite summary (profile {session.profile.name})")
    for line in summary_lines(session.results.values()):
        terminalreporter.write_line(line)
    if session.relations:
        terminalreporter.write_sep("-", "perfsuite relations")
        for line in relation_lines(session.relations.values()):
            terminalreporter.write_line(line)
    ranked = ranking(session.results.values(), options.job(config))
    if ranked:
        price = session.profile.gpu_hour_price
        priced = f"{price:g} {session.profile.currency} per GPU-hour" if price is not None else "no price set"
        terminalreporter.write_sep("-", f"perfsuite cost and time ranking ({priced})")
        for line in ranking_lines(ranked, options.job(config)):
            terminalreporter.write_line(line)
    why = nothing_measured(session)
    if why:
        terminalreporter.write_sep("!", "perfsuite: nothing was measured", red=True)
        terminalreporter.write_line(why)


def _coverage(config: pytest.Config) -> Coverage | None:
    """The run's coverage in its mode (None when nothing was selected)."""
    session = config.stash.get(SESSION_KEY, None)
    return gate.coverage(config, session.results.values() if session is not None else ())


def _max_batch_summary(terminalreporter: Any, config: pytest.Config) -> None:
    profile = config.stash[SESSION_KEY].profile.name if SESSION_KEY in config.stash else "-"
    terminalreporter.write_sep("-", f"perfsuite max batch (profile {profile})")
    for line in maxbatch.summary_lines(maxbatch.results_of(config)):
        terminalreporter.write_line(line)
    why = maxbatch.nothing_searched(config)
    if why:
        terminalreporter.write_sep("!", "perfsuite: nothing was measured", red=True)
        terminalreporter.write_line(why)


def nothing_measured(perf: PerfSession) -> str:
    """Why a session whose scenarios all skipped proves nothing ("" if something was measured)."""
    results = list(perf.results.values())
    if not results or any(r.status in ("ok", "oom") for r in results):
        return ""
    shown = "; ".join(f"{r.scenario.id}: {r.judgement.message}" for r in results[:3])
    more = f" (and {len(results) - 3} more)" if len(results) > 3 else ""
    return (
        f"all {len(results)} scenario(s) skipped without measuring, so this run proves nothing and exits "
        f"non-zero: {shown}{more}. `python -m perfsuite doctor` shows what can run here."
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    path = config.getoption("--perf-json")
    perf = config.stash.get(SESSION_KEY, None)
    if perf is not None and nothing_measured(perf) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    found = _coverage(config)
    if gate.problems(config, found) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if maxbatch.enabled(config) and maxbatch.nothing_searched(config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    compared = [r for r in abtest.results_of(config) if r.comparisons]
    if abtest.enabled(config) and not compared and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # an A/B that compared nothing proves nothing
    if not path and perf is None:
        return
    fingerprint = perf.current_fingerprint() if perf else machine.fingerprint(config)
    results = list(perf.results.values()) if perf else []
    relations = [r.to_json() for r in perf.relations.values()] if perf else []
    ceilings = perf.ceilings.to_json() if perf else {}
    ranked = ranking(results, options.job(config))
    profile = perf.profile.name if perf else ""
    document = results_document(
        fingerprint,
        profile,
        results,
        relations=relations,
        ceilings=ceilings,
        ranking=ranked,
        **({"coverage": found.to_json()} if found is not None else {}),
        **maxbatch.results_json(config),
        **({"ab": [r.to_json() for r in abtest.results_of(config)]} if abtest.enabled(config) else {}),
    )
    if path:
        try:
            write_results(Path(path), document)
        except ResultsWriteError as exc:
            _fail_session(session, str(exc))
    if perf is not None:
        config.hook.pytest_perfsuite_session_finished(config=config, document=document)


def _fail_session(session: pytest.Session, message: str) -> None:
    """Say ``message`` in red and make the run exit non-zero (no traceback)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message, red=True)
    else:
        print(message, file=sys.stderr)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
