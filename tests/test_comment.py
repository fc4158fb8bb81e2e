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
    assert f"perfsuite judged commit {HEAD[:12]} of #42" in lines[1]
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
    asked = yaml.safe_load(render(Model.parse(None))[".github/workflows/perf.yml"])["jobs"]["gate"]["env"]["ASKED"]
    assert asked == "${{ github.event_name == 'pull_request' || github.event_name == 'issue_comment' }}"
    assert "env.ASKED == 'true'" in render_step["if"] and "always()" in render_step["if"]
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
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "head"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "PERF_VENV": str(tmp_path / "venv"), "GITHUB_EVENT_PATH": str(EVENT)}
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", render_step["run"]], cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0
    written = (tmp_path / "perf-comment.md").read_text()
    assert written.startswith(f"{comment.MARKER}\nperfsuite judged commit {head[:12]} of #42")  # what it checked out
    assert RERUN in written.splitlines()


COMMENT_EVENT = Path(__file__).parent / "data" / "issue_comment_created.json"


def gate_runs(event_name: str, payload: dict, every_pr: bool = False) -> bool:
    """Whether init's workflow starts its GPU gate job for this event, as GitHub evaluates its ``if:``."""
    import yaml
    from gh_expressions import evaluate, truthy

    from perfsuite.commands.init import Model, render

    workflow = yaml.safe_load(render(Model.parse(None), every_pr=every_pr)[".github/workflows/perf.yml"])
    github = {"event_name": event_name, "event": payload, "repository": "acme/trainer"}
    return truthy(evaluate(workflow["jobs"]["gate"]["if"], {"github": github}))


def test_the_gpu_gate_runs_on_a_pull_request_only_when_asked() -> None:
    labelled = json.loads(EVENT.read_text())  # synchronize, labelled perf
    assert gate_runs("pull_request", labelled)
    unlabelled = json.loads(EVENT.read_text())
    unlabelled["pull_request"]["labels"] = [{"name": "bug"}]
    assert not gate_runs("pull_request", unlabelled)
    assert gate_runs("pull_request", unlabelled, every_pr=True)  # init --every-pr
    other_label = {**labelled, "action": "labeled", "label": {"name": "bug"}}
    assert not gate_runs("pull_request", other_label)  # adding another label runs nothing again
    assert gate_runs("pull_request", {**labelled, "action": "labeled", "label": {"name": "perf"}})
    fork = json.loads(EVENT.read_text())
    fork["pull_request"]["head"]["repo"]["full_name"] = "stranger/trainer"
    assert not gate_runs("pull_request", fork) and not gate_runs("pull_request", fork, every_pr=True)
    for scheduled in ("push", "schedule"):
        assert gate_runs(scheduled, {})
    assert not gate_runs("workflow_dispatch", {})  # the record job's


@pytest.mark.parametrize(
    ("body", "association", "on_pull_request", "runs"),
    [
        ("/perf", "MEMBER", True, True),
        ("/perf please", "OWNER", True, True),
        ("/perf", "COLLABORATOR", True, True),
        ("/perf", "CONTRIBUTOR", True, False),
        ("/perf", "NONE", True, False),
        ("looks good", "MEMBER", True, False),
        ("/perf", "MEMBER", False, False),  # a comment on an issue, not a pull request
    ],
)
def test_a_perf_comment_runs_the_gate_only_from_members_owners_and_collaborators(
    body: str, association: str, on_pull_request: bool, runs: bool
) -> None:
    payload = json.loads(COMMENT_EVENT.read_text())
    payload["comment"].update(body=body, author_association=association)
    if not on_pull_request:
        del payload["issue"]["pull_request"]
    assert gate_runs("issue_comment", payload) is runs


def test_a_perf_comments_payload_names_the_pull_request_and_the_run_gives_its_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.json").write_text(json.dumps(results()))
    args = ["summary", str(tmp_path / "r.json"), "--event", str(COMMENT_EVENT)]
    assert main(args) == 0
    assert "perfsuite judged this pull request of #42" in capsys.readouterr().out
    assert main([*args, "--head", HEAD]) == 0
    assert f"perfsuite judged commit {HEAD[:12]} of #42" in capsys.readouterr().out
