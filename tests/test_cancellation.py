"""Nothing outlives a cancelled run: SIGTERM and SIGKILL of pytest mid-scenario,
and a rank killed by a signal is the rank blamed, with the signal named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import CPU_PROFILE, bench_module, default_sigint, leftover_workers, rank_processes

# Thousands of steps: the run is still measuring whenever the test strikes.
LONG = 'Scenario("long", "ddp", model=TINY, world_size=2, micro_batch=8, global_batch=16, seq_len=32, warmup_steps=1, steps=5000)'
BASELINE = {"schema_version": 1, "profile": "cpu", "group": "long", "scenarios": {}}


def start(project: pytest.Pytester, *args: str) -> subprocess.Popen[bytes]:
    project.makepyfile(test_bench=bench_module(f"    {LONG},"))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        CPU_PROFILE,
        "--perf-timeout=300",
        f"--basetemp={project.path / 'tmp'}",
        *args,
    ]
    return subprocess.Popen(
        cmd, cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=default_sigint
    )


def wait_until_measuring(project: pytest.Pytester, run: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        phases = [p.read_text() for p in (project.path / "tmp").rglob("rank*.phase")]
        if len(phases) == 2 and all(p.startswith("measure") for p in phases):
            return
        assert run.poll() is None, run.stdout.read().decode() if run.stdout else ""
        time.sleep(0.2)
    pytest.fail("the scenario never reached its measured steps")


# The sweep gives each process 5 s after SIGTERM and 5 s after SIGKILL; then
# pytest reports and exits. Seen once at over 15 s with the other xdist worker busy.
EXIT_WITHIN_S = 30.0


def wait_for_exit(run: subprocess.Popen[bytes], within_s: float) -> None:
    """Wait for ``run`` to exit; fail with its output and its processes if it does not."""
    try:
        run.wait(within_s)
    except subprocess.TimeoutExpired:
        tree = [f"{p.pid} {p.status()} {p.cmdline()[:4]}" for p in psutil.Process(run.pid).children(recursive=True)]
        run.kill()
        out = run.stdout.read().decode() if run.stdout else ""
        pytest.fail(f"pytest still running {within_s:.0f} s after the signal; its processes {tree}\n{out[-3000:]}")


def wait_for_no_leftovers(project: pytest.Pytester, within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while (left := leftover_workers(project.path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_of_pytest_stops_every_rank_and_leaves_baselines_untouched(
    project: pytest.Pytester, signum: signal.Signals
) -> None:
    baseline = project.path / "baselines" / "cpu" / "long.json"
    baseline.parent.mkdir(parents=True)
    baseline.write_text(json.dumps(BASELINE))
    before = baseline.read_bytes()
    run = start(project, "--perf-update-baselines")
    wait_until_measuring(project, run)
    struck = time.monotonic()
    run.send_signal(signum)
    wait_for_exit(run, EXIT_WITHIN_S)
    left = wait_for_no_leftovers(project, 10 - (time.monotonic() - struck))
    assert not left, [p.cmdline() for p in left]
    assert baseline.read_bytes() == before
    out = run.stdout.read().decode() if run.stdout else ""
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out


def test_sigkill_of_pytest_leaves_nothing_running(project: pytest.Pytester) -> None:
    run = start(project)
    wait_until_measuring(project, run)
    workers = leftover_workers(project.path)
    assert len(rank_processes(project.path)) == 2 and len(workers) >= 3  # the agent and both ranks
    run.kill()  # nothing in pytest runs: the ranks' watchdog and the agent must notice
    run.wait(5)
    left = wait_for_no_leftovers(project, 10)
    assert not left, [p.cmdline() for p in left]


def test_a_rank_killed_by_sigkill_is_the_rank_blamed_and_the_signal_named(project: pytest.Pytester) -> None:
    out = project.path / "r.json"
    run = start(project, f"--perf-json={out}")
    wait_until_measuring(project, run)
    os.kill(rank_processes(project.path)[1].pid, signal.SIGKILL)  # what the host's OOM killer does
    run.wait(60)
    result = json.loads(out.read_text())["results"][0]
    assert result["verdict"] == "error"
    assert result["failure"]["rank"] == 1, result["failure"]
    assert "killed by SIGKILL (signal 9)" in result["failure"]["message"]
    assert "OOM killer" in result["failure"]["message"]
    assert not wait_for_no_leftovers(project, 10)


def test_sigkill_of_a_warm_agent_leaves_nothing_running(project: pytest.Pytester) -> None:
    """The agent a warm parent forked (the cpu default), killed mid-measurement: its ranks notice
    their agent is gone, the launch fails, and nothing of it runs 10 s later; the parent lives on."""
    out = project.path / "r.json"
    run = start(project, f"--perf-json={out}")
    wait_until_measuring(project, run)
    ranks = rank_processes(project.path).values()
    (agent,) = {psutil.Process(rank.ppid()) for rank in ranks}
    parent = psutil.Process(agent.ppid())
    assert "perfsuite.rank.worker.warmparent" in " ".join(parent.cmdline())
    struck = time.monotonic()
    agent.kill()
    wait_for_exit(run, EXIT_WITHIN_S)
    assert not wait_for_no_leftovers(project, 10 - (time.monotonic() - struck))
    assert json.loads(out.read_text())["results"][0]["verdict"] == "error"
    assert parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE
