"""The live progress line: on a terminal only, never under -q or in a log."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CPU_PROFILE, TINY_SHAPE, bench_module

from perfsuite.launch.progress import line, read_phases

STEPS_SHAPE = TINY_SHAPE.replace("steps=4", "steps=120")  # a few seconds of measuring to watch


def test_the_line_shows_rank_zeros_phase_the_rank_behind_and_the_time(tmp_path: Path) -> None:
    assert line("g.s", [], 2.4) == "g.s: launching 2s"
    (tmp_path / "rank0.phase").write_text("measure step 3/12")
    (tmp_path / "rank1.phase").write_text("warmup step 2")
    assert line("g.s", read_phases(tmp_path), 14.0) == "g.s: measure step 3/12 (rank 1 at warmup step 2) 14s"


def run_on_a_terminal(project: pytest.Pytester, *args: str) -> str:
    """pytest on a pseudo-terminal, as a person would run it; everything it drew."""
    main, child = pty.openpty()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", CPU_PROFILE, *args]
    proc = subprocess.Popen(cmd, cwd=project.path, stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(10)
    os.close(main)
    return out.decode(errors="replace")


def test_a_terminal_sees_the_scenario_its_phase_and_step_count(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(f'Scenario("tiny", "fp32", TINY, {STEPS_SHAPE}),'))
    drawn = run_on_a_terminal(project)
    assert "\rtiny.fp32: measure step " in drawn and "/120" in drawn, drawn[-2000:]
    quiet = run_on_a_terminal(project, "-q")
    assert "tiny.fp32: measure step" not in quiet


def test_a_log_gets_no_progress_line(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(f'Scenario("tiny", "fp32", TINY, {STEPS_SHAPE}),'))
    result = project.runpytest_subprocess(CPU_PROFILE, "-p", "no:cacheprovider")
    assert "measure step" not in result.stdout.str()
