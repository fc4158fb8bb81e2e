"""The next GPU call's scripts (docs/gpu-runs/next/) hold up before a GPU session spends its
minutes on them: every test id they name is collected, every perfsuite option and command they
pass exists, and the OOM check's plugin imports (it once imported a module the layout move
had renamed, which only a GPU session would have found)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NEXT = ROOT / "docs/gpu-runs/next"
SCRIPTS = sorted(NEXT.glob("*.sh"))


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@cache
def collected() -> frozenset[str]:
    out = run("-m", "pytest", "bench_tests", "--collect-only", "-q", "-p", "no:cacheprovider", "--perf-profile=cpu")
    return frozenset(line for line in out.splitlines() if "::" in line)


def named_ids(text: str) -> set[str]:
    """Node ids written out, and the scenario ids of panel.sh's PANEL_ROWS (built into node ids there)."""
    ids = set(re.findall(r"bench_tests/test_\w+\.py::test_\w+\[[\w.]+\]", text))
    rows = re.search(r'PANEL_ROWS="([^"]+)"', text)
    for sid in rows.group(1).split() if rows else ():
        group = sid.split(".")[0]
        ids.add(f"bench_tests/test_{group}.py::test_{group}[{sid}]")
    return ids


def test_there_are_scripts_and_they_parse() -> None:
    assert SCRIPTS
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_test_id_a_script_names_is_collected(script: Path) -> None:
    missing = named_ids(script.read_text()) - collected()
    assert not missing, f"{script.name} names tests that bench_tests does not have: {sorted(missing)}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_perf_option_a_script_passes_exists(script: Path) -> None:
    options = set(re.findall(r"--perf-[a-z-]+", script.read_text()))
    known = set(re.findall(r"--perf-[a-z-]+", run("-m", "pytest", "--help", "-p", "no:cacheprovider")))
    assert options - known == set(), f"{script.name} passes unknown options"


def test_the_perfsuite_commands_the_call_runs_take_its_arguments() -> None:
    assert "--launch" in run("-m", "perfsuite", "explain", "--help")
    assert "--no-smoke" in run("-m", "perfsuite", "doctor", "--help")
    text = (NEXT / "device-call.sh").read_text()
    for command in set(re.findall(r"-m perfsuite (\w+)", text)):
        run("-m", "perfsuite", command, "--help")


def test_the_oom_checks_plugin_imports_and_caps_at_20_gib() -> None:
    spec = importlib.util.spec_from_file_location("oomcheck", NEXT / "oomcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (profile,) = module.pytest_perfsuite_profiles()
    assert profile.device_memory_cap_mib == 20 * 1024 and profile.device == "cuda"


@pytest.mark.slow  # four pytest sessions, 25-50 s: `make test-slow`
def test_the_warm_against_exec_stage_runs_and_is_read_on_cpu(tmp_path: Path) -> None:
    """Stage 3's measurement and its reader, one round on cpu: both rows train both ways, the warm
    launches forked from their parent, and the summary compares them."""
    call = (NEXT / "device-call.sh").read_text()
    rows = re.findall(r'"(bench_tests/test_\w+\.py::test_\w+\[[\w.]+\])"', call[call.index('stage "3') :])
    assert len(rows) == 2
    env = {**os.environ, "PYTHON": sys.executable, "PROFILE": "cpu"}
    subprocess.run(
        ["bash", "scripts/launch_overhead.sh", str(tmp_path), "1", *rows],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    summary = run("scripts/launch_overhead_summary.py", str(tmp_path))
    assert summary.count("warm: 1/1 ok, started ['warm']") == 2, summary
    assert summary.count("exec: 1/1 ok, started ['exec']") == 2, summary
    assert summary.count("throughput warm against exec") == 2, summary
    # A forked rank counts the pages it inherited: the parent imports only what the row's ranks do.
    peaks = {
        p.name: json.loads(p.read_text())["results"][0]["metrics"]["peak_mem_mib"] for p in tmp_path.glob("*.json")
    }
    for row in ("row0", "row1"):
        assert peaks[f"{row}-warm0.json"] == pytest.approx(peaks[f"{row}-exec0.json"], rel=0.05), peaks
