"""``python -m perfsuite init`` in a team's repository, and the example team repository in
``examples/`` (issue 29): what init writes records its baselines with the command it prints,
then passes; a second init changes nothing; the workflow passes actionlint; the example repo
trains its own module and a Llama config, and catches a planted slowdown."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import CPU_PROFILE, JUDGE_UNDER_CONTENTION, require
from test_workflows import ROOT, lint

from perfsuite.commands.init import MERGED, RECORD, Model, Outcome, init, install, render
from perfsuite.commands.init.install import how_installed


def perfsuite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.run(sys.executable, "-m", "perfsuite", *args)


def gate(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("bench_tests", "-p", "no:cacheprovider", "-rA", CPU_PROFILE, *args)


@pytest.mark.serial  # its last run must pass as measured: a neighbouring test's launches would be contention
@pytest.mark.parametrize("own_conftest", [False, True], ids=["fresh", "own-conftest"])
def test_a_fresh_repo_is_red_until_the_printed_command_records_its_baselines(
    pytester: pytest.Pytester, own_conftest: bool
) -> None:
    if own_conftest:  # a team's repository with its own fixtures: init keeps them, and the gate goes the same path
        pytester.makeconftest(OWN_CONFTEST)
    done = perfsuite(pytester, "init")
    assert done.ret == 0, done.stderr.str()
    assert RECORD in done.stdout.str()
    assert ("appended perfsuite's note" in done.stdout.str()) == own_conftest
    written = {p.relative_to(pytester.path).as_posix() for p in pytester.path.rglob("*") if p.is_file()}
    assert written - {"stdout", "stderr"} == set(render(Model.parse(None)))  # (pytester's own capture files)
    red = gate(pytester)
    assert red.ret == 1  # nothing judged: no baseline yet, and the message says how to record one
    red.stdout.fnmatch_lines(["*no_baseline: example.ddp*--perf-update-baselines*"])
    recorded = gate(pytester, "--perf-update-baselines")
    recorded.assert_outcomes(passed=1)
    # What the new baseline lets this gate see (issue 39), so a team knows the drop it would miss.
    recorded.stdout.fnmatch_lines(["*what these baselines let the gate see*", "example.ddp: caught 9 times in 10*"])
    assert (pytester.path / "baselines" / "cpu" / "example.json").is_file()
    gate(pytester).assert_outcomes(passed=1)


def test_init_again_changes_nothing_and_a_changed_file_needs_force(tmp_path: Path) -> None:
    model = Model.parse(None)
    written = init(tmp_path, model, force=False).written
    stamps = {p: (tmp_path / p).stat().st_mtime_ns for p in written}
    assert init(tmp_path, model, force=False) == Outcome((), written)
    assert stamps == {p: (tmp_path / p).stat().st_mtime_ns for p in written}
    (tmp_path / "PERFSUITE.md").write_text("# ours\n")
    with pytest.raises(
        FileExistsError, match=r"PERFSUITE\.md, bench_tests/test_perf\.py|bench_tests/test_perf\.py, PERFSUITE\.md"
    ):
        init(tmp_path, Model.parse("llama"), force=False)
    assert (tmp_path / "PERFSUITE.md").read_text() == "# ours\n"
    assert "ModelSpec.module" in (tmp_path / "bench_tests" / "test_perf.py").read_text()  # nothing was written
    assert set(init(tmp_path, Model.parse("llama"), force=True).written) == {"PERFSUITE.md", "bench_tests/test_perf.py"}


OWN_CONFTEST = """import pytest


@pytest.fixture
def team_fixture():
    return 42
"""


def test_a_teams_own_conftest_is_kept_and_gets_perfsuites_note_once(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(OWN_CONFTEST)
    done = init(tmp_path, Model.parse(None), force=True)  # even --force never replaces it
    assert done.added == ("conftest.py",) and "conftest.py" not in done.written
    text = (tmp_path / "conftest.py").read_text()
    assert text.startswith(OWN_CONFTEST) and text.count(MERGED["conftest.py"]) == 1
    assert "#     def pytest_perfsuite_profiles():" in text
    compile(text, "conftest.py", "exec")  # still Python: the note is comments
    again = init(tmp_path, Model.parse(None), force=False)
    assert again.added == () and again.written == () and "conftest.py" in again.unchanged
    assert (tmp_path / "conftest.py").read_text() == text


def test_model_flags_name_a_build_function_or_a_transformers_type(pytester: pytest.Pytester) -> None:
    assert (
        'ModelSpec.module("teampkg.models:build")'
        in render(Model.parse("teampkg.models:build"))["bench_tests/test_perf.py"]
    )
    done = perfsuite(pytester, "init", "--model", "qwen2")
    assert done.ret == 0, done.stderr.str()
    assert 'ModelSpec.hf("qwen2", layers=2' in (pytester.path / "bench_tests" / "test_perf.py").read_text()
    collected = pytester.runpytest_subprocess("bench_tests", "--collect-only", "-q", "-p", "no:cacheprovider")
    collected.stdout.fnmatch_lines(["*test_qwen2*qwen2.ddp*"])
    # An image model gets the one task transformers has a vit model for, and images of its own size.
    assert perfsuite(pytester, "init", "--model", "vit", "--force").ret == 0
    assert '"vit", "image_classification", ' in (pytester.path / "bench_tests" / "test_perf.py").read_text()
    collected = pytester.runpytest_subprocess("bench_tests", "--collect-only", "-q", "-p", "no:cacheprovider")
    collected.stdout.fnmatch_lines(["*vit.ddp*"])
    for bad, words in (
        ("meta-llama/Llama-3.2-1B", "would need the network"),
        ("teampkg:models:build", "package.module:function"),
        ("lama", "is no transformers model type here"),
    ):
        refused = perfsuite(pytester, "init", "--model", bad, "--force")
        assert refused.ret == 2 and words in refused.stderr.str()


def test_a_module_that_does_not_import_yet_is_said_and_a_root_that_cannot_be_written_refused(
    pytester: pytest.Pytester,
) -> None:
    done = perfsuite(pytester, "init", "--model", "teampkg.models:build")
    assert done.ret == 0  # the team's package may be installed later
    done.stdout.fnmatch_lines(
        [
            "note: 'teampkg.models:build' cannot be imported: ModuleNotFoundError: No module named 'teampkg' "
            f"(the ranks import it with PYTHONPATH={pytester.path}: put its package under the rootdir*",
        ]
    )
    (pytester.path / "teampkg").mkdir()
    (pytester.path / "teampkg" / "models.py").write_text("def build(device, dtype):\n    pass\n")
    assert "note:" not in perfsuite(pytester, "init", "--model", "teampkg.models:build").stdout.str()
    refused = perfsuite(pytester, "init", str(pytester.path / "conftest.py" / "sub"))
    assert refused.ret == 2
    refused.stderr.fnmatch_lines(["perfsuite init: cannot write in *conftest.py/sub: *conftest.py is not a folder"])


def test_the_workflow_init_writes_passes_actionlint_and_installs_what_its_steps_run(tmp_path: Path) -> None:
    init(tmp_path, Model.parse(None), force=False)
    workflow = tmp_path / ".github" / "workflows" / "perf.yml"
    done = lint(ROOT, workflow)
    assert done.returncode == 0, done.stdout + done.stderr
    # Its last step draws the HTML report, which exits 2 without the report extra: a red job after a green gate.
    text = workflow.read_text()
    installed = re.search(r'PERFSUITE_REQUIREMENT: "perfsuite\[([a-z,]+)\](.*)"', text)
    assert installed is not None and "-m perfsuite report" in text
    assert {"engines", "report"} <= set(installed.group(1).split(","))
    assert installed.group(2) == f"=={how_installed().requirement.split('==')[1]}"  # this checkout: editable


@pytest.mark.parametrize(
    ("direct_url", "requirement"),
    [
        (None, "perfsuite[engines,report]==1.2.3"),
        (
            '{"url": "https://github.com/team/perfsuite", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}',
            "perfsuite[engines,report] @ git+https://github.com/team/perfsuite@abc123",
        ),
        (
            '{"url": "https://example.com/perfsuite-1.2.3-py3-none-any.whl", "archive_info": {}}',
            "perfsuite[engines,report] @ https://example.com/perfsuite-1.2.3-py3-none-any.whl",
        ),
        (
            '{"url": "file:///wheels/perfsuite-1.2.3-py3-none-any.whl", "archive_info": {}}',
            "perfsuite[engines,report]==1.2.3",
        ),
        ('{"url": "file:///nowhere/perfsuite", "dir_info": {"editable": true}}', "perfsuite[engines,report]==1.2.3"),
    ],
)
def test_init_records_how_perfsuite_was_installed(
    monkeypatch: pytest.MonkeyPatch, direct_url: str | None, requirement: str
) -> None:
    class Dist:
        version = "1.2.3"

        def read_text(self, name: str) -> str | None:
            return direct_url if name == "direct_url.json" else None

    monkeypatch.setattr(install.importlib.metadata, "distribution", lambda name: Dist())
    found = how_installed()
    assert found.requirement == requirement
    if direct_url and "file:///wheels" in direct_url:
        assert "PERFSUITE_WHEELHOUSE" in found.source  # a local wheel: the runner finds it in its wheelhouse
    assert f'PERFSUITE_REQUIREMENT: "{requirement}"' in render(Model.parse(None), found)[".github/workflows/perf.yml"]


@pytest.mark.slow  # ~2 min; CI keeps its parts: a module (test_custom_module) and Llama (test_hf_models) e2e
def test_the_example_team_repo_records_judges_and_catches_a_slowdown(pytester: pytest.Pytester) -> None:
    require("transformers")
    shutil.copytree(ROOT / "examples" / "team-repo", pytester.path, dirs_exist_ok=True)
    (pytester.path / "conftest.py").write_text(JUDGE_UNDER_CONTENTION)
    recorded = gate(pytester, "--perf-update-baselines", "--perf-json", "rec.json")
    recorded.assert_outcomes(passed=5)
    results = {r["id"]: r for r in json.loads((pytester.path / "rec.json").read_text())["results"]}
    assert results["team.llama_ddp"]["config"]["model"]["source"] == "llama"  # from the config.json
    # The 1B job's cpu shape: the tiny Llama, built where each engine wants it.
    made = {k: results[f"llama_1b.{k}"]["metrics"]["detail"]["materialised"] for k in ("fsdp2", "zero3")}
    assert made == {"fsdp2": "meta, then sharded", "zero3": "zero.Init"}
    state = {k: r["metrics"]["model_state_bytes_per_rank"] for k, r in results.items()}
    assert state["team.encoder_fsdp2"] < state["team.encoder_ddp"]
    slowed = gate(pytester, "-k", "encoder_ddp", "--perf-inject-slowdown=300")
    slowed.assert_outcomes(failed=1)
    slowed.stdout.fnmatch_lines(["*team.encoder_ddp: regression: samples_per_s*"])


def test_the_pull_request_ab_compares_with_the_merge_base_at_the_teams_minimum_effect(tmp_path: Path) -> None:
    # The step's own shell, run against a repository whose main moved on after the branch: the A/B
    # must take the merge base (not main's tip, whose later commits are not the PR's), pass the
    # repository variable's minimum effect only when set, and write the job summary (and the table
    # the pull-request comment appends).
    import subprocess

    import yaml

    init(tmp_path / "team", Model.parse(None), force=False)
    workflow = yaml.safe_load((tmp_path / "team" / ".github" / "workflows" / "perf.yml").read_text())
    step = next(
        s for job in workflow["jobs"].values() for s in job["steps"] if s.get("name") == "A/B against the base branch"
    )
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for message in ("base", "on main after the branch"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
        if message == "base":
            subprocess.run([*git, "branch", "pr"], check=True)
    subprocess.run([*git, "update-ref", "refs/remotes/origin/main", "main"], check=True)
    subprocess.run([*git, "checkout", "-q", "pr"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the pull request"], check=True)
    base = subprocess.run([*git, "rev-parse", "pr~1"], capture_output=True, text=True, check=True).stdout.strip()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\necho "| the A/B table |" > perf-ab.md\n'
    )
    (venv / "bin" / "python").chmod(0o755)
    for effect, expected in (("0.02", ["--min-effect", "0.02"]), ("", [])):
        env = {
            "PATH": "/usr/bin:/bin",
            "PERF_VENV": str(venv),
            "BASE_REF": "main",
            "AB_KEYWORD": "amp",
            "MIN_EFFECT": effect,
            "AB_MAX_PAIRS": "",
            "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
            "ARGS_OUT": str(tmp_path / "args"),
        }
        subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=repo, env=env, check=True)
        args = (tmp_path / "args").read_text().split("\n")[:-1]
        assert args[:4] == ["-m", "perfsuite", "ab-rev", base]
        assert args[4:] == [
            "bench_tests",
            "-k",
            "amp",
            *expected,
            "--max-pairs",
            "8",
            "--json",
            "perf-ab.json",
            "--markdown",
            "perf-ab.md",
        ]
        assert (tmp_path / "summary.md").read_text().endswith("| the A/B table |\n")  # the job summary's too
