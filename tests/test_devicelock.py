"""Two runs never measure on the same GPUs at once, and scenarios refuse pytest-xdist."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import CPU_PROFILE, bench_module

from perfsuite.launch import devicelock

HOLDER = textwrap.dedent(
    """
    import sys, time
    from perfsuite.launch import devicelock
    with devicelock.hold(["0", "1"], "other.scenario", wait_s=5):
        print("held", flush=True)
        time.sleep(float(sys.argv[1]))
    """
)


@pytest.fixture
def other_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.Popen[str]:
    """Another process holding GPUs 0 and 1 for 30 s (killed at teardown)."""
    monkeypatch.setenv(devicelock.LOCK_DIR_VAR, str(tmp_path / "locks"))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, "30"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_run_waits_then_refuses_naming_the_run_that_holds_the_gpu(other_run: subprocess.Popen[str]) -> None:
    said: list[str] = []
    start = time.monotonic()
    with pytest.raises(devicelock.DeviceBusy) as caught, devicelock.hold(["1"], "mine", wait_s=6, say=said.append):
        pass
    assert 6 <= time.monotonic() - start < 12
    assert f"pid {other_run.pid}" in str(caught.value) and "other.scenario" in str(caught.value)
    assert "--perf-device-wait" in str(caught.value)
    assert said and f"waiting for GPU 1, held by pid {other_run.pid}" in said[0]


def test_gpus_free_again_when_the_holder_dies_even_by_sigkill(other_run: subprocess.Popen[str]) -> None:
    os.kill(other_run.pid, signal.SIGKILL)
    other_run.wait()
    start = time.monotonic()
    with devicelock.hold(["0", "1"], "mine", wait_s=5):
        assert time.monotonic() - start < 1
        assert "mine" in devicelock.holder("0")


def test_different_gpus_do_not_wait(other_run: subprocess.Popen[str]) -> None:
    start = time.monotonic()
    with devicelock.hold(["2", "3"], "mine", wait_s=5):
        assert time.monotonic() - start < 1


def test_scenarios_refuse_pytest_xdist_with_a_clear_message(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_bench=bench_module(
            '    Scenario("x", "ddp", model=TINY, world_size=2, micro_batch=8, global_batch=16, seq_len=32),'
        )
    )
    result = project.runpytest_subprocess(CPU_PROFILE, "-p", "xdist", "-n", "1", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*perfsuite scenarios cannot run under pytest-xdist*measure each other*"])
    assert result.ret != 0
    assert not (project.path / "baselines" / "cpu").exists()
