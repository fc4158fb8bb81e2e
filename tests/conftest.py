"""Shared helpers: pytester projects that use the real plugin with 2 gloo ranks."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from perfsuite.core.protocol import RANK_PROCESS_PREFIX
from perfsuite.launch import warm

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True, scope="session")
def _warm_parents_shared() -> None:
    """One warm parent per import set for this process (an xdist worker) and every pytest it
    starts: a self-test's launches pay no imports after the first (perfsuite.launch.warm)."""
    warm.share_with_children()


@pytest.fixture(autouse=True, scope="session")
def _one_cache_for_the_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every run this session starts keeps its answers in one cache (perfsuite.core.models.probe), as a
    user's runs share ~/.cache: pytester gives each child its own HOME, which would ask transformers
    again in every run that collects an ``hf`` model (about 10 s of CPU each). Shared by xdist's workers."""
    os.environ.setdefault("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp().parent / "xdg-cache"))


@pytest.fixture(autouse=True)
def _outside_github_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI on GitHub sets GITHUB_ACTIONS=true: the self-tests' runs would print the plugin's
    annotations (perfsuite.reports.exports.github) as if their planted regressions were the repository's."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, whose runs skip the op profiles' extra launches (one per recorded baseline and per
    regression: about a minute of CI). The tests of op profiles pass --perf-op-profiles=auto, which comes
    after PYTEST_ADDOPTS on the command line and wins. (pytester clears PYTEST_ADDOPTS when it starts.)"""
    monkeypatch.setenv("PYTEST_ADDOPTS", "--perf-op-profiles=off")
    subprocess_run = pytester.runpytest_subprocess

    def perfsuite_only(*args: str | os.PathLike[str], **kwargs: Any) -> pytest.RunResult:
        # A run loads perfsuite and what it names with -p, not every plugin of this venv (hypothesis,
        # xdist, benchmark, timeout, anyio: 0.45 s of CPU a run, and the self-tests start hundreds).
        # Set for the child alone: ab-rev, bisect and bootstrap start pytest as a team would.
        with monkeypatch.context() as env:
            env.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
            return subprocess_run("-p", "perfsuite", *args, **kwargs)

    monkeypatch.setattr(pytester, "runpytest_subprocess", perfsuite_only)
    return pytester


#: Tests of cpu behaviour pin the cpu profile, so they pass on GPU machines too.
CPU_PROFILE = "--perf-profile=cpu"
#: A fake ``pynvml`` (tests/fake_nvml) that presents the GPUs in FAKE_NVML_GPUS.
FAKE_NVML = Path(__file__).parent / "fake_nvml"

#: A GPT small enough that a 2-rank torchrun run takes a few seconds on 2 cores.
#: perfsuite's own plain-torch GPT: importing a transformers model costs each
#: rank ~3 s of CPU (measured: a 2-rank launch 3.9-4.2 s against 5.5-5.9 s with
#: the same-size Hugging Face BERT), and most self-tests launch one. The
#: benchmark gate trains the Hugging Face models.
TINY = 'ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)'
TINY_SHAPE = "world_size=2, micro_batch=8, global_batch=16, seq_len=32, warmup_steps=1, steps=4"


#: A pytester conftest for tests that plant a regression and check its verdict:
#: regressions are judged however busy the machine is (a neighbouring xdist
#: worker's launch is contention) and however much its steps spread (a CI run
#: saw a tiny step's CV at 53-57% beside another worker, over cpu's 50% limit),
#: and the normalised rate gets the raw rate's wide tolerance, so the outcome
#: depends on what the test planted only.
JUDGE_UNDER_CONTENTION = textwrap.dedent(
    """
    from dataclasses import replace
    from perfsuite.core.profiles import BUILTIN_PROFILES

    def pytest_perfsuite_profiles():
        cpu = BUILTIN_PROFILES["cpu"]
        return [replace(cpu, max_foreign_cores=float("inf"), max_steal_cores=float("inf"), max_cv=float("inf"),
                        tolerances={**cpu.tolerances, "samples_per_ref": 0.4})]
    """
)


def require(module: str) -> None:
    """Skip unless ``module`` is installed, without importing it. A pytester test that imports
    torch (deepspeed and transformers do) has pytester drop it from ``sys.modules`` afterwards,
    and the next import of torch in that process fails (``SystemError: bad call flags``)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def team_gate(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The plugin in a subprocess on the cpu profile, over a pytester repo's own modules."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", CPU_PROFILE, *args)


def record_team(pytester: pytest.Pytester, module_source: str, passed: int) -> dict[str, Any]:
    """A team repo's benchmark module (``test_team.py``) recorded on cpu, regressions judged however
    busy the machine is (JUDGE_UNDER_CONTENTION): its results by scenario id."""
    pytester.makeconftest(JUDGE_UNDER_CONTENTION)
    pytester.makepyfile(test_team=module_source)
    pytester.mkdir("baselines")
    # No op profile with each baseline: one launch more per scenario, and these tests ask what was measured.
    recorded = team_gate(pytester, "--perf-update-baselines", "--perf-op-profiles=off", "--perf-json", "rec.json")
    recorded.assert_outcomes(passed=passed)
    return {r["id"]: r for r in json.loads((pytester.path / "rec.json").read_text())["results"]}


def bench_module(scenarios: str, imports: str = "") -> str:
    """Source of a benchmark module declaring ``scenarios`` (Python list body)."""
    return textwrap.dedent(
        f"""
        from perfsuite import ModelSpec, Scenario, parametrize
        {imports}
        TINY = {TINY}
        SCENARIOS = [
        {scenarios}
        ]

        @parametrize(SCENARIOS)
        def test_bench(perf, scenario):
            perf.check(scenario)
        """
    )


def leftover_workers(marker: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (a test's tmp dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(marker) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def rank_processes(marker: Path) -> dict[int, psutil.Process]:
    """Live ranks (by global rank) among :func:`leftover_workers`: the processes
    named ``perfsuite-r<RANK>``, forked from their agent or not."""
    found = {}
    for proc in leftover_workers(marker):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if (name := proc.name()).startswith(RANK_PROCESS_PREFIX):
                found[int(name.removeprefix(RANK_PROCESS_PREFIX))] = proc
    return found


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester dir with an empty baselines folder and a one-scenario module."""
    pytester.mkdir("baselines")
    return pytester


def interpreter_path() -> str:
    """This interpreter's ``sys.path`` as a PYTHONPATH: the ranks' path the probes get in a test
    that calls them outside a pytest run of the plugin."""
    return os.pathsep.join(p for p in sys.path if p)


def default_sigint() -> None:
    """A ``preexec_fn``: SIGINT as a terminal's Ctrl-C meets the child. A background job of a
    non-interactive shell (a CI script's ``cmd &``) starts with SIGINT ignored, every child inherits
    that, and Python then installs no KeyboardInterrupt handler: pytest ignored test_cancellation's
    SIGINT in two fresh-clone CI runs started that way, and bisect test_bisect's Ctrl-C in a third."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
