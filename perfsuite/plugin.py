"""pytest integration: options, the ``perf`` fixture, the summary and the results file.

Loaded through the ``pytest11`` entry point. Every scenario is its own test: the
verdict fails, skips or passes *that* test, never a session hook.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perfsuite import abtest, gate, hookspecs, maxbatch
from perfsuite.baselines import BaselineError
from perfsuite.ceilings import Ceilings, ceilings_first
from perfsuite.compare import FAILING, MetricCheck, check_metric
from perfsuite.cost import Job, cost_of, ranking, ranking_lines
from perfsuite.coverage import Coverage
from perfsuite.envs import PythonEnv
from perfsuite.fingerprint import foreign_gpu_processes, machine_fingerprint
from perfsuite.flops import mfu, of_peak
from perfsuite.launch import Launcher
from perfsuite.launch.devicelock import DeviceBusy
from perfsuite.launch.slurm import SlurmLauncher
from perfsuite.launch.torchrun import (
    LocalTorchrun,
    Topology,
    TopologyError,
    TorchrunLauncher,
)
from perfsuite.profiles import (
    HardwareProfile,
    ProfileError,
    ProfileRegistry,
    profile_for,
)
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
PROFILE_KEY = pytest.StashKey[HardwareProfile]()
FINGERPRINT_KEY = pytest.StashKey[dict]()
LAUNCHER_KEY = pytest.StashKey[Launcher]()

# Exporters are pytest plugins of their own: each adds its options to the
# perfsuite group and implements pytest_perfsuite_session_finished, the same
# hook a user's plugin would.
pytest_plugins: list[str] = ["perfsuite.exports.benchjson", "perfsuite.exports.history"]


class StaleBaselineWarning(UserWarning):
    """A scenario beat its baseline by more than the tolerance."""


class BusyGpuWarning(UserWarning):
    """Other processes were using the GPUs when the session started."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfsuite", "perfsuite: training speed and memory gate")
    group.addoption(
        "--perf-profile",
        metavar="NAME",
        help="hardware profile (baselines/<NAME>/); default: detected from the machine "
        "('cpu' without GPUs, e.g. 'nvidia-h100-80gb-hbm3-x1' with them; 'cuda-32gb' "
        "caps each GPU to 32 GiB)",
    )
    group.addoption(
        "--perf-baselines",
        metavar="DIR",
        help="baselines folder (default: <rootdir>/baselines)",
    )
    group.addoption(
        "--perf-update-baselines",
        action="store_true",
        help="record the measured outcome of every scenario that runs as its new "
        "baseline (keeps hand-set tolerances and notes)",
    )
    group.addoption(
        "--perf-accept-oom",
        metavar="ID",
        action="append",
        default=[],
        help="with --perf-update-baselines: record this scenario's out-of-memory as expected "
        "(repeatable); an OOM nothing expected is never recorded otherwise",
    )
    group.addoption("--perf-json", metavar="PATH", help="write the results file to PATH")
    group.addoption(
        "--perf-timeout",
        metavar="SECONDS",
        type=float,
        help="wall-clock limit per scenario run (default: scenario's, else profile's)",
    )
    group.addoption(
        "--perf-repeats",
        metavar="N",
        type=int,
        default=1,
        help="launch each scenario N times with fresh workers and pool the samples (default 1)",
    )
    group.addoption(
        "--perf-confirm",
        metavar="N",
        type=int,
        default=1,
        help="measure an apparent regression N more times; it fails only if every "
        "confirmation regresses too (default 1; 0 disables)",
    )
    gate.add_options(group)  # --perf-allow-unjudged, and the deprecated --perf-fail-unreliable
    group.addoption(
        "--perf-gpu-busy",
        choices=("warn", "error", "ignore"),
        default="warn",
        help="what to do when other processes use the GPUs before a run (default warn)",
    )
    group.addoption(
        "--perf-inject-slowdown",
        metavar="PCT",
        type=float,
        default=0.0,
        help="self-test of the gate: workers do PCT%% more real device work per step",
    )
    group.addoption(
        "--perf-device-wait",
        metavar="SECONDS",
        type=float,
        default=600.0,
        help="how long a launch waits for GPUs another perfsuite run on this host holds, "
        "then fails naming that run (default 600)",
    )
    group.addoption(
        "--perf-launcher",
        choices=("local", "torchrun", "slurm"),
        default="local",
        help="how workers start: one torchrun agent here (local), --perf-nnodes agents "
        "rendezvousing at --perf-rdzv-endpoint (torchrun), or one agent per node via srun (slurm)",
    )
    group.addoption("--perf-nnodes", metavar="N", type=int, default=1, help="nodes (torchrun launcher)")
    group.addoption("--perf-nproc-per-node", metavar="N", type=int, help="ranks per node (default: world_size / nodes)")
    group.addoption(
        "--perf-rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous endpoint (default: a free loopback port)"
    )
    group.addoption(
        "--perf-local-agents",
        metavar="N",
        type=int,
        help="torchrun agents to start on this host (default: all --perf-nnodes, i.e. one host)",
    )
    group.addoption(
        "--perf-calibrate",
        action="store_true",
        help="record baselines with tolerances derived from the spread between "
        "--perf-repeats launches (3 sigma); see 'python -m perfsuite calibrate'",
    )
    maxbatch.add_options(group)  # --perf-find-max-batch and its bounds
    abtest.add_options(group)  # --perf-env, --perf-ab and its tolerance and self-test
    group.addoption(
        "--perf-gpu-hour-price",
        metavar="PRICE",
        type=float,
        help="price of one GPU (cpu: one rank) for one hour, for cost per sample and the cost ranking "
        "(ini: perf_gpu_hour_price; default: the profile's gpu_hour_price)",
    )
    group.addoption("--perf-currency", metavar="CODE", help="currency of the price (ini: perf_currency)")
    group.addoption(
        "--perf-job",
        metavar="SAMPLES[xEPOCHS]",
        help="a job to estimate for every configuration, e.g. 2048x2: its time and cost are "
        "ranked per group (ini: perf_job)",
    )
    parser.addini("perf_gpu_hour_price", "price of one GPU-hour (see --perf-gpu-hour-price)", default="")
    parser.addini("perf_currency", "currency of perf_gpu_hour_price", default="")
    parser.addini("perf_job", "SAMPLES[xEPOCHS] job to estimate (see --perf-job)", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perfsuite: a perfsuite benchmark scenario")
    _check_number(config, "--perf-timeout", "a positive number of seconds", lambda x: x > 0)
    if config.getoption("--perf-repeats") < 1:
        raise pytest.UsageError(f"--perf-repeats must be >= 1, got {config.getoption('--perf-repeats')}")
    if config.getoption("--perf-confirm") < 0:
        raise pytest.UsageError(f"--perf-confirm must be >= 0, got {config.getoption('--perf-confirm')}")
    _check_number(config, "--perf-device-wait", ">= 0 seconds", lambda x: x >= 0)
    _check_number(config, "--perf-inject-slowdown", "a non-negative percentage", lambda x: x >= 0)
    for flag in ("--perf-nnodes", "--perf-nproc-per-node", "--perf-local-agents"):
        value = config.getoption(flag)
        if value is not None and value < 1:
            raise pytest.UsageError(f"{flag} must be >= 1, got {value}")
    if config.getoption("--perf-launcher") == "local" and config.getoption("--perf-nnodes") > 1:
        raise pytest.UsageError("--perf-nnodes > 1 needs --perf-launcher=torchrun or slurm")
    _check_endpoint(config)
    _check_baselines(config)
    if config.getoption("--perf-accept-oom") and not (
        config.getoption("--perf-update-baselines") or config.getoption("--perf-calibrate")
    ):
        raise pytest.UsageError("--perf-accept-oom records a baseline: use it with --perf-update-baselines")
    if config.getoption("--perf-calibrate") and config.getoption("--perf-repeats") < 2:
        raise pytest.UsageError("--perf-calibrate needs --perf-repeats N with N >= 2 to see the spread")
    maxbatch.check_options(config)
    gate.check_options(config)
    config.stash[ENVS_KEY] = abtest.check_options(config)
    _job(config)  # fail fast on a malformed --perf-job
    if config.getoption("--perf-profile"):
        _profile(config)  # fail fast on an unknown profile name
    config.stash[LAUNCHER_KEY] = _launcher(config)  # e.g. slurm outside an allocation


def _check_baselines(config: pytest.Config) -> None:
    """A ``--perf-baselines`` folder that does not exist is a typo unless this run records into it:
    judged against nothing, every scenario would skip as no_baseline."""
    given = config.getoption("--perf-baselines")
    records = config.getoption("--perf-update-baselines") or config.getoption("--perf-calibrate")
    reads = not (config.getoption(abtest.FLAG) or config.getoption(maxbatch.FLAG))
    if given and reads and not records and not Path(given).is_dir():
        raise pytest.UsageError(
            f"--perf-baselines {given}: no such folder. Give the folder that holds <profile>/<group>.json "
            "(default <rootdir>/baselines), or record into it with --perf-update-baselines"
        )


def _check_endpoint(config: pytest.Config) -> None:
    """``--perf-rdzv-endpoint``: HOST:PORT, for the torchrun launcher only (the
    local one takes a free loopback port, Slurm's the allocation's first node)."""
    value = config.getoption("--perf-rdzv-endpoint")
    if value is None:
        return
    if config.getoption("--perf-launcher") != "torchrun":
        raise pytest.UsageError(
            "--perf-rdzv-endpoint only applies with --perf-launcher=torchrun "
            f"(--perf-launcher={config.getoption('--perf-launcher')} chooses its own endpoint)"
        )
    host, _, port = value.rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not host.strip("[]") or bare_ipv6 or not port.isdigit() or not 0 < int(port) < 65536:
        raise pytest.UsageError(
            f"--perf-rdzv-endpoint takes HOST:PORT with a port in 1-65535 (an IPv6 host in brackets), got {value!r}"
        )


def _check_number(config: pytest.Config, flag: str, what: str, ok: Callable[[float], bool]) -> None:
    """A float flag's value: nan passes no comparison and inf is no setting, so both are refused."""
    value = config.getoption(flag)
    if value is not None and not (math.isfinite(value) and ok(value)):
        raise pytest.UsageError(f"{flag} must be {what}, got {value}")


def _fingerprint(config: pytest.Config) -> dict[str, Any]:
    if FINGERPRINT_KEY not in config.stash:
        config.stash[FINGERPRINT_KEY] = machine_fingerprint()
    return config.stash[FINGERPRINT_KEY]


def _profile(config: pytest.Config) -> HardwareProfile:
    if PROFILE_KEY in config.stash:
        return config.stash[PROFILE_KEY]
    fingerprint = _fingerprint(config)
    registry = ProfileRegistry()
    for extra in config.hook.pytest_perfsuite_profiles():
        registry = registry.with_extra(extra or [])
    name = (
        config.getoption("--perf-profile")
        or config.hook.pytest_perfsuite_hardware_key(fingerprint=fingerprint)
        or profile_for(fingerprint)
    )
    try:
        profile = registry.get(name, fingerprint)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    profile = _priced(config, profile)
    config.stash[PROFILE_KEY] = profile
    return profile


def _priced(config: pytest.Config, profile: HardwareProfile) -> HardwareProfile:
    """The profile with the price and currency the command line or ini set."""
    price: Any = config.getoption("--perf-gpu-hour-price")
    if price is None and config.getini("perf_gpu_hour_price"):
        try:
            price = float(config.getini("perf_gpu_hour_price"))
        except ValueError:
            raise pytest.UsageError(
                f"ini option perf_gpu_hour_price must be a number, got {config.getini('perf_gpu_hour_price')!r}"
            ) from None
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise pytest.UsageError(f"--perf-gpu-hour-price (ini: perf_gpu_hour_price) must be >= 0, got {price}")
    currency = config.getoption("--perf-currency") or config.getini("perf_currency") or profile.currency
    return replace(profile, gpu_hour_price=price if price is not None else profile.gpu_hour_price, currency=currency)


def _job(config: pytest.Config) -> Job | None:
    """The job named by --perf-job / perf_job, e.g. ``2048x2`` (None if none)."""
    text = config.getoption("--perf-job") or config.getini("perf_job")
    if not text:
        return None
    samples, _, epochs = str(text).partition("x")
    try:
        job = Job(int(samples), int(epochs or 1))
    except ValueError:
        job = Job(0)
    if job.samples < 1 or job.epochs < 1:
        raise pytest.UsageError(
            f"--perf-job must be SAMPLES or SAMPLESxEPOCHS with positive ints, e.g. 2048x2; got {text!r}"
        )
    return job


def _compare(config: pytest.Config) -> Any:
    def compare(check: MetricCheck) -> MetricCheck:
        custom = config.hook.pytest_perfsuite_compare_metric(check=check)
        return custom if custom is not None else check_metric(check)

    return compare


def _extra_metrics(config: pytest.Config) -> Any:
    def extra(result: ScenarioResult, ceilings: Ceilings) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for found in config.hook.pytest_perfsuite_extra_metrics(
            result=result, fingerprint=_fingerprint(config), profile=_profile(config), ceilings=ceilings
        ):
            merged.update(found or {})
        return merged

    return extra


@pytest.hookimpl
def pytest_perfsuite_extra_metrics(
    result: ScenarioResult, fingerprint: dict[str, Any], profile: HardwareProfile, ceilings: Ceilings
) -> dict[str, Any] | None:
    """perfsuite's default: for a GPU training run, MFU (Megatron's FLOP
    formula, named in the value, against the GPU's datasheet peak); for a GPU
    microbenchmark, its fraction of the datasheet peak; for a training run on
    any device, its achieved TFLOP/s against the best matmul this session measured."""
    if result.metrics is None:
        return None
    config = result.scenario.to_config()
    gpus = fingerprint.get("gpus") or []
    extra: dict[str, Any] = {}
    if profile.device == "cuda" and gpus and "model" in config:
        extra["mfu"] = mfu(config, result.metrics.step_time_median_s, gpus[0]["name"], profile.peak_tflops)
    if profile.device == "cuda" and gpus and config["kind"] in ("microbench", "membw"):
        extra["peak"] = of_peak(config, result.metrics.value(result.scenario.primary), gpus[0]["name"])
    ceiling = ceilings.fraction(config, result.metrics.step_time_median_s)
    if ceiling is not None:
        extra["ceiling"] = ceiling
    values = {name: result.metrics.value(name) for name in result.metrics.values}
    cost = cost_of(config, values, result.metrics.health, profile.gpu_hour_price, profile.currency)
    if cost is not None:
        extra["cost"] = cost
    return extra or None


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
            profile=_profile(config),
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
        _check_xdist(config)
        _check_gpus_idle(config)
        gate.load_quarantine(config, settings.baselines_dir, settings.profile.name)
        request.addfinalizer(_stop_on_sigterm())
        launcher = config.stash[LAUNCHER_KEY]
        config.stash[SESSION_KEY] = PerfSession(
            settings, _fingerprint(config), launcher, _compare(config), _extra_metrics(config), _progress(config)
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


def _stop_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM (a cancelled CI job, Slurm's scancel) stop the run as Ctrl-C
    does, so the launcher's cleanup stops every agent and rank before pytest
    exits; by default SIGTERM ends the process at once and orphans them. Left
    alone when someone else already handles SIGTERM, or off the main thread.
    Returns the finalizer that restores the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return lambda: None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"perfsuite: {signal.Signals(signum).name} received, stopping the run")

    signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


def _launcher(config: pytest.Config) -> Launcher:
    kind = config.getoption("--perf-launcher")
    nproc = config.getoption("--perf-nproc-per-node")
    try:
        if kind == "slurm":
            return SlurmLauncher.from_env(nproc)
    except TopologyError as exc:
        raise pytest.UsageError(str(exc)) from None
    if kind == "local":
        return LocalTorchrun()
    topology = Topology(
        nnodes=config.getoption("--perf-nnodes"),
        nproc_per_node=nproc,
        rdzv_endpoint=config.getoption("--perf-rdzv-endpoint"),
        local_agents=config.getoption("--perf-local-agents"),
    )
    return TorchrunLauncher(topology)


def _check_xdist(config: pytest.Config) -> None:
    """Scenarios on several pytest-xdist workers at once would measure each other."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        pytest.fail(
            f"perfsuite scenarios cannot run under pytest-xdist (this is worker {worker.get('workerid', '?')}): "
            "parallel scenarios share the machine and measure each other. Run them without -n "
            "(or with -p no:xdist); perfsuite's own self-tests may use -n, scenarios may not.",
            pytrace=False,
        )


def _check_gpus_idle(config: pytest.Config) -> None:
    mode = config.getoption("--perf-gpu-busy")
    busy = foreign_gpu_processes() if mode != "ignore" else []
    if not busy:
        return
    listing = ", ".join(f"pid {p['pid']} on GPU {p['gpu']} ({p['used_mib']} MiB)" for p in busy)
    message = f"other processes use the GPUs, timings will be skewed: {listing}"
    if mode == "error":
        pytest.fail(message + " (--perf-gpu-busy=error)", pytrace=False)
    warnings.warn(BusyGpuWarning(message), stacklevel=1)


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
    ranked = ranking(session.results.values(), _job(config))
    if ranked:
        price = session.profile.gpu_hour_price
        priced = f"{price:g} {session.profile.currency} per GPU-hour" if price is not None else "no price set"
        terminalreporter.write_sep("-", f"perfsuite cost and time ranking ({priced})")
        for line in ranking_lines(ranked, _job(config)):
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
    fingerprint = perf.current_fingerprint() if perf else _fingerprint(config)
    results = list(perf.results.values()) if perf else []
    relations = [r.to_json() for r in perf.relations.values()] if perf else []
    ceilings = perf.ceilings.to_json() if perf else {}
    ranked = ranking(results, _job(config))
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
