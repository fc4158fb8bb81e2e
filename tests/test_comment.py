"""The pull-request comment (issue 57): rendered from a GitHub ``pull_request`` event payload
(``tests/data/pull_request_synchronize.json``, its fields as GitHub sends them) and a results file,
with the run's link, each failed row's commands and the A/B's table; the workflow that posts it is
checked in tests/test_init.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsuite.__main__ import main
from perfsuite.reports.html import comment

EVENT = Path(__file__).parent / "data" / "pull_request_synchronize.json"
HEAD = "9c1e5a7b3d2f4e6a8b0c1d2e3f4a5b6c7d8e9f01"
RERUN = "pytest 'bench_tests/test_perf.py::test_example[example.ddp]' --perf-profile=cpu"
AB_REV = "python -m perfsuite ab-rev HEAD~1 'bench_tests/test_perf.py::test_example[example.ddp]' --perf-profile=cpu"


def results() -> dict:
    failed = {
        "id": "example.ddp",
        "group": "example",
        "status": "ok",
        "verdict": "regression",
        "message": "samples_per_s 80 vs baseline 100: -20.0%",
        "metrics": {"samples_per_s": {"mean": 80.0, "std": 2.0, "n": 10}},
        "repro": {"rerun": RERUN, "ab_rev": AB_REV, "bisect": None},
    }
    passed = {"id": "example.fp32", "group": "example", "status": "ok", "verdict": "pass", "message": "", "metrics": {}}
    return {"machine": {"host": "gpu-7"}, "profile": "cpu", "results": [failed, passed]}


def test_the_comment_names_the_pull_request_the_run_and_how_to_reproduce_each_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "perf-results.json").write_text(json.dumps(results()))
    (tmp_path / "perf-ab.md").write_text("### perfsuite A/B against main\n\n| scenario | outcome |\n")
    for name, value in {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "acme/trainer"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GITHUB_RUN_ID", "8123456789")
    args = ["summary", str(tmp_path / "perf-results.json"), "--event", str(EVENT)]
    assert main([*args, "--append", str(tmp_path / "perf-ab.md"), "--append", str(tmp_path / "none.md")]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == comment.MARKER  # the workflow edits the comment that starts with it
    assert f"perfsuite judged {HEAD[:12]}, the head of #42" in lines[1]
    assert "https://github.com/acme/trainer/actions/runs/8123456789" in lines[1]
    assert any(line.startswith("| `example.ddp` | ❌ regression |") for line in lines)
    at = lines.index("#### Reproduce `example.ddp`")
    assert lines[at + 2 : at + 8] == ["```sh", "# run it again", RERUN, "# settle it on this machine", AB_REV, "```"]
    assert "Reproduce `example.fp32`" not in text  # a pass has nothing to reproduce
    assert text.rstrip().endswith("| scenario | outcome |") and "### perfsuite A/B against main" in text


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ("{oops", "cannot be read"),
        (json.dumps({"action": "push", "ref": "refs/heads/main"}), "has no 'pull_request'"),
        (json.dumps({"pull_request": {"number": 42, "head": {}}}), "needs 'number' and 'head.sha'"),
    ],
)
def test_an_event_that_names_no_pull_request_is_refused_naming_the_file(
    tmp_path: Path, payload: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.json").write_text(json.dumps(results()))
    (tmp_path / "event.json").write_text(payload)
    assert main(["summary", str(tmp_path / "r.json"), "--event", str(tmp_path / "event.json")]) == 2
    err = capsys.readouterr().err
    assert words in err and str(tmp_path / "event.json") in err


def test_inits_workflow_renders_the_comment_with_its_own_step_and_posts_it_in_place(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import yaml

    from perfsuite.commands.init import Model, render

    workflow = yaml.safe_load(render(Model.parse(None))[".github/workflows/perf.yml"])
    gate = workflow["jobs"]["gate"]
    assert gate["permissions"]["pull-requests"] == "write"
    assert "head.repo.full_name == github.repository" in gate["if"]  # a fork's pull request: no run, no comment
    steps = {step.get("name"): step for step in gate["steps"]}
    render_step, post = steps["Pull-request comment"], steps["Post the pull-request comment"]
    assert "github.event_name == 'pull_request'" in render_step["if"] and "always()" in render_step["if"]
    assert post["uses"].startswith("actions/github-script@") and "perf-comment.md" in post["if"]
    script = post["with"]["script"]
    assert "readFileSync('perf-comment.md'" in script and "split('\\n')[0]" in script  # the marker: line 1
    assert "updateComment" in script and "createComment" in script and "startsWith(marker)" in script
    # The render step's command, run as the workflow runs it, on this event payload.
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "python").chmod(0o755)
    (tmp_path / "perf-results.json").write_text(json.dumps(results()))
    env = {**os.environ, "PERF_VENV": str(tmp_path / "venv"), "GITHUB_EVENT_PATH": str(EVENT)}
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", render_step["run"]], cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0
    written = (tmp_path / "perf-comment.md").read_text()
    assert written.startswith(comment.MARKER + "\n") and RERUN in written.splitlines()
