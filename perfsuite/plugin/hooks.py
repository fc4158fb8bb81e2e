"""pytest integration: options, the ``perf`` fixture, the summary and the results file.

Loaded through the ``pytest11`` entry point. Every scenario is its own test: the
verdict fails, skips or passes *that* test, never a session hook.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from perfsuite.core.relations import Relation, RelationOutcome
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.gate.session import PerfSession, RunSettings, ScenarioResult
from perfsuite.judge.ceilings import Ceilings, ceilings_first
from perfsuite.judge.compare import MetricCheck, check_metric
from perfsuite.judge.coverage import Coverage, coverage_of
from perfsuite.launch import Launcher, procs
from perfsuite.launch.envs import PythonEnv
from perfsuite.launch.progress import Progress
from perfsuite.plugin import collection, exitstatus, guards, hookspecs, machine, modes, options, tiers
from perfsuite.plugin.modes import StaleBaselineWarning  # noqa: F401  (users filter perfsuite.plugin.hooks.StaleBaselineWarning)
from perfsuite.plugin.modes.baseline import run_or_fail
from perfsuite.reports.cost import ranking
from perfsuite.reports.summary import ResultsWriteError, results_document, write_results

SESSION_KEY = pytest.StashKey["PerfSession"]()
ENVS_KEY = pytest.StashKey[dict[str, PythonEnv]]()
LAUNCHER_KEY = pytest.StashKey[Launcher]()
#: Each scenario's pytest node id, by scenario id: the results file's ``nodeids``, so a tool that
#: reruns some of them (``ab-rev``'s later pairs) selects exactly those.
NODEIDS_KEY = pytest.StashKey[dict[str, str]]()

# perfsuite's default extra metrics and its exporters are pytest plugins of
# their own: each implements a perfsuite hook (pytest_perfsuite_extra_metrics,
# pytest_perfsuite_session_finished) as a user's plugin would, and the
# exporters add their options to the perfsuite group.
pytest_plugins: list[str] = [
    "perfsuite.plugin.extras",
    "perfsuite.reports.exports.benchjson",
    "perfsuite.reports.exports.history",
    "perfsuite.reports.exports.github",
]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)
    modes.add_options(parser.getgroup("perfsuite"))
    tiers.add_option(parser.getgroup("perfsuite"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perfsuite: a perfsuite benchmark scenario")
    mode = modes.pick(config)  # exactly one: judge against baselines, search max batch, or A/B
    options.check_options(config, mode.reads_baselines)
    config.stash[ENVS_KEY] = options.envs(config)
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


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """The collection step: a module (or class) whose tests take a scenario that a child interpreter
    finds wrong fails to collect, as it did when the scenario's constructor asked the child."""
    report = yield
    return collection.checked(collector, report)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Only the selected tier's scenarios (--perf-tier); ceiling-setting microbenchmarks run first,
    so every later training result can be set against this session's measured best (perfsuite.judge.ceilings)."""
    tiers.deselect(config, items)
    items[:] = ceilings_first(items)
    options.check_accept_oom(config, {scenario.id for scenario in collection.scenarios(items)})


def _worker_env(config: pytest.Config) -> dict[str, str]:
    # The path the collection step checked the scenarios' modules with.
    return {"PYTHONPATH": collection.rank_path(config)}


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
            lock_dir=options.lock_dir(config),
            op_profiles=config.getoption("--perf-op-profiles"),
            count_work=config.getoption("--perf-work") == "on",
            artifacts_dir=options.artifacts_dir(config),
            selected=tuple(dict.fromkeys(s.id for s in collection.scenarios(request.session.items))),
            **exitstatus.contention_settings(config),
        )
        guards.check_xdist(config)
        guards.check_gpus_idle(config)
        exitstatus.load_quarantine(config, settings.baselines_dir, settings.profile.name)
        # SIGTERM (a cancelled job) stops the run as Ctrl-C does: the launcher then stops every
        # agent and rank before pytest exits, instead of orphaning them.
        request.addfinalizer(procs.interrupt_on_sigterm("perfsuite: "))
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
        self._ran(scenario)
        return run_or_fail(self.session, scenario)

    def check(self, scenario: BaseScenario) -> Any:
        """Run ``scenario`` in this run's mode and pass, fail or skip this test by what it found:
        its verdict against the baseline (a :class:`ScenarioResult`), or under ``--perf-find-max-batch``
        and ``--perf-ab`` that mode's result."""
        self._ran(scenario)
        config = self.request.config
        return modes.of(config).check(self.session, scenario, invoked_as(config, self.request.node.nodeid))

    def _ran(self, scenario: BaseScenario) -> None:
        config = self.request.config
        config.stash.setdefault(NODEIDS_KEY, {})[scenario.id] = invoked_as(config, self.request.node.nodeid)

    def check_relation(self, relation: Relation) -> RelationOutcome:
        """Check a relation between two scenarios of this run; fail if violated."""
        return modes.of(self.request.config).check_relation(self.session, relation)


def invoked_as(config: pytest.Config, nodeid: str) -> str:
    """``nodeid`` (relative to pytest's rootdir) as a command line in the invocation folder selects it."""
    path, sep, rest = nodeid.partition("::")
    return os.path.relpath(config.rootpath / path, config.invocation_params.dir) + sep + rest


@pytest.fixture
def perf(perf_session: PerfSession, request: pytest.FixtureRequest) -> Perf:
    """Run perfsuite scenarios from a test: ``perf.check(scenario)``."""
    return Perf(perf_session, request)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    modes.of(config).summary(terminalreporter, session)
    found = _coverage(config)
    failing = exitstatus.problems(config, found)
    if found is not None:
        exitstatus.summary(terminalreporter, found, failing)
    else:
        for line in failing:
            terminalreporter.write_line(line, red=True)


def _coverage(config: pytest.Config) -> Coverage | None:
    """What the run's mode judged of the selected scenarios (None when nothing was selected)."""
    found = modes.of(config).outcomes(config.stash.get(SESSION_KEY, None))
    return coverage_of(found) if found else None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    path = config.getoption("--perf-json")
    perf = config.stash.get(SESSION_KEY, None)
    mode = modes.of(config)
    found = _coverage(config)
    unproven = mode.nothing_measured(perf) or exitstatus.problems(config, found)
    if unproven and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
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
        **({"min_effect": perf.profile.min_effect} if perf else {}),
        **({"contention_limits": perf.profile.contention_limits()} if perf else {}),
        **({"coverage": found.to_json()} if found is not None else {}),
        **({"nodeids": dict(sorted(config.stash[NODEIDS_KEY].items()))} if NODEIDS_KEY in config.stash else {}),
        **mode.results_json(perf),
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
