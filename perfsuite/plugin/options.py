"""The plugin's command-line options and ini values, and their validation.

``add_options`` declares them (the run modes, :mod:`perfsuite.plugin.modes`, the gate
and the exporters add their own group members); ``check_options`` refuses a bad value at start with a
usage error that names the flag and what it takes. Pytest side, torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest

from perfsuite.core.files import output_problem
from perfsuite.core.protocol import RankStart
from perfsuite.gate.settings import OP_PROFILE_MODES, WORK_MODES
from perfsuite.launch.envs import EnvError, PythonEnv, parse_envs
from perfsuite.plugin import exitstatus
from perfsuite.reports.cost import Job

#: ``--perf-rank-start`` takes these.
RANK_STARTS: tuple[RankStart, ...] = get_args(RankStart)
#: The flags below that decide what a row measures or how it is judged: a failed row's rerun
#: command keeps the run's own values of them (:mod:`perfsuite.judge.repro`).
JUDGING_FLAGS = (
    "--perf-profile",
    "--perf-baselines",
    "--perf-rank-start",
    "--perf-work",
    "--perf-env",
    "--perf-launcher",
    "--perf-nnodes",
    "--perf-nproc-per-node",
    "--perf-inject-slowdown",
    "--perf-repeats",
    "--perf-confirm",
    "--perf-timeout",
)


def add_options(parser: pytest.Parser) -> None:
    """Every perfsuite option and ini value (the modes and the gate add their own)."""
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
    exitstatus.add_options(group)  # --perf-allow-unjudged, and the deprecated --perf-fail-unreliable
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
        "--perf-lock-dir",
        metavar="DIR",
        help="folder of the per-GPU locks (one file per card UUID) that keep two runs off one GPU; "
        "containers on one host share it by mounting one host folder there "
        "(ini: perf_lock_dir; default: $PERFSUITE_LOCK_DIR, else /tmp/perfsuite-locks)",
    )
    group.addoption(
        "--perf-launcher",
        choices=("local", "torchrun", "slurm"),
        default="local",
        help="how workers start: one torchrun agent here (local), --perf-nnodes agents "
        "rendezvousing at --perf-rdzv-endpoint (torchrun), or one agent per node via srun (slurm)",
    )
    group.addoption(
        "--perf-rank-start",
        choices=RANK_STARTS,
        help="how a launch's processes start: warm (the agent forked from a parent that imported torch and "
        "the scenario's libraries once per run, the ranks from the agent), fork (the agent a fresh interpreter, "
        "the ranks its forks) or exec (a fresh interpreter each); default: the profile's rank_start "
        "(warm on cpu, exec on cuda)",
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
    group.addoption(
        "--perf-op-profiles",
        choices=OP_PROFILE_MODES,
        default="auto",
        help="op profiles (torch.profiler, one extra launch each): auto stores one with every recorded baseline "
        "and explains a regression or a failing OOM with a fresh one; always also profiles scenarios that "
        "passed; off never profiles (default auto). Traces go to --perf-artifacts",
    )
    group.addoption(
        "--perf-work",
        choices=WORK_MODES,
        default="on",
        help="count what each scenario's step does (op calls and the bytes they read, host syncs, collectives and "
        "their bytes, compiled graphs and graph breaks, device kernels) in two untimed "
        "steps after the measured ones, record it with --perf-update-baselines and judge it exactly against the "
        "recorded counts, on any processor; off neither counts nor judges (default on)",
    )
    group.addoption(
        "--perf-artifacts",
        metavar="DIR",
        help="folder for op-profile traces and allocator snapshots (default: perf-artifacts/ beside "
        "--perf-json, else in the invocation folder)",
    )
    group.addoption(
        "--perf-env",
        metavar="NAME=PYTHON",
        action="append",
        default=[],
        help="name a Python environment (its interpreter) that scenarios (field env=) or --perf-ab run ranks in; "
        "repeatable",
    )
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
    parser.addini("perf_lock_dir", "folder of the per-GPU locks (see --perf-lock-dir)", default="")


def check_options(config: pytest.Config, reads_baselines: bool = True) -> None:
    """Refuse bad values at start, naming the flag and what it takes (a pytest usage error).
    ``reads_baselines``: whether the run's mode judges against the baselines folder."""
    if config.getoption("--perf-profile") == "":  # an unset CI variable, most likely
        raise pytest.UsageError("--perf-profile is empty: give a profile name, or leave the flag out to detect one")
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
    _check_baselines(config, reads_baselines)
    _check_outputs(config)
    if config.getoption("--perf-accept-oom") and not (
        config.getoption("--perf-update-baselines") or config.getoption("--perf-calibrate")
    ):
        raise pytest.UsageError("--perf-accept-oom records a baseline: use it with --perf-update-baselines")
    if config.getoption("--perf-calibrate") and config.getoption("--perf-repeats") < 2:
        raise pytest.UsageError("--perf-calibrate needs --perf-repeats N with N >= 2 to see the spread")
    exitstatus.check_options(config)
    envs(config)
    job(config)  # fail fast on a malformed --perf-job


def check_accept_oom(config: pytest.Config, selected: set[str]) -> None:
    """Each ``--perf-accept-oom`` id must be a selected scenario's: a typo would accept nothing and
    say nothing, and the OOM it meant would still refuse to be recorded."""
    unknown = sorted(set(config.getoption("--perf-accept-oom") or ()) - selected)
    if unknown:
        raise pytest.UsageError(
            f"--perf-accept-oom {', '.join(unknown)}: no selected scenario has this id; give the id the "
            "summary shows (group.name, e.g. model_state_sharding.ddp_fp32) of a scenario this run records"
        )


def _check_baselines(config: pytest.Config, reads: bool) -> None:
    """A ``--perf-baselines`` folder that does not exist is a typo unless this run records into it:
    judged against nothing, every scenario would skip as no_baseline."""
    given = config.getoption("--perf-baselines")
    records = config.getoption("--perf-update-baselines") or config.getoption("--perf-calibrate")
    if given and reads and not records and not Path(given).is_dir():
        raise pytest.UsageError(
            f"--perf-baselines {given}: no such folder. Give the folder that holds <profile>/<group>.json "
            "(default <rootdir>/baselines), or record into it with --perf-update-baselines"
        )


def _check_outputs(config: pytest.Config) -> None:
    """Where the run writes: refused now, not after every scenario has run."""
    for flag, folder in (("--perf-json", False), ("--perf-artifacts", True)):
        problem = output_problem(flag, config.getoption(flag), folder)
        if problem:
            raise pytest.UsageError(problem)


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


def job(config: pytest.Config) -> Job | None:
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


def envs(config: pytest.Config) -> dict[str, PythonEnv]:
    """The Python environments named by ``--perf-env`` (``current`` always among them)."""
    try:
        return parse_envs(config.getoption("--perf-env"))
    except EnvError as exc:
        raise pytest.UsageError(str(exc)) from None


def lock_dir(config: pytest.Config) -> Path | None:
    """The GPU locks' folder: ``--perf-lock-dir``, else the ini's (relative to the rootdir); None
    leaves it to the environment."""
    if config.getoption("--perf-lock-dir"):
        return Path(config.getoption("--perf-lock-dir"))
    given = config.getini("perf_lock_dir")
    return config.rootpath / given if given else None


def artifacts_dir(config: pytest.Config) -> Path:
    """Where traces and allocator snapshots go: ``--perf-artifacts``, else beside the results file."""
    given = config.getoption("--perf-artifacts")
    if given:
        return Path(given)
    results = config.getoption("--perf-json")
    return (Path(results).parent if results else config.invocation_params.dir) / "perf-artifacts"
