"""The workflow ``perfsuite init`` writes, run as a fresh self-hosted runner would run it (issue 39).

Its jobs' ``run:`` steps execute in order with bash, in a fresh clone of a team repository made
by ``init``, with GitHub's step semantics (a step runs after a failure only under ``always()``;
``$GITHUB_OUTPUT`` feeds ``steps.<id>.outputs``, ``$GITHUB_ENV`` the later steps' environment).
perfsuite is installed by the workflow's own install step, from a wheelhouse with no index, into
a virtual environment kept in the runner's tool cache (outside the workspace checkout cleans)
that reaches the runner's packages through ``--system-site-packages``: here a folder standing
for the runner's Python, which holds this environment's packages (torch, the engines) but not
perfsuite. The install step also runs alone, with a real venv and a tiny wheel: a cleaned
workspace reuses the kept environment without pip, a changed requirement builds another, once.
Every ``${{ }}`` expression and ``if:`` the workflow uses must be one this file knows, so a
changed workflow fails here until its test follows. ``uses:`` steps (checkout, artifacts, the
baseline pull request) are what the test does around the jobs: it commits the recorded
baselines as the merged pull request would. An ``actions/cache`` step's inputs are expanded
where it stands, as the action reads them, and kept with the job's steps: the folder and key
it would restore and save (a fresh runner restores nothing).

CI runs the slice: red on a profile without baselines, naming the record job; the record job's
update; green once they are committed. ``make test-slow`` runs the whole: a planted slowdown in
the team's model is red, the tiers select by event, and nightly runs land in the shared history.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_workflows import ROOT

from perfsuite.commands.init import Model, init

BRANCH = "perf-history"


@dataclass
class Event:
    """The GitHub context a job runs in."""

    name: str  # pull_request, schedule, workflow_dispatch, push
    inputs: Mapping[str, str] = field(default_factory=dict)
    vars: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Step:
    name: str
    ok: bool
    output: str


@dataclass
class Context:
    event: Event
    env: dict[str, str]
    workspace: Path
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    failed: bool = False


class Ran(list[Step]):
    """The steps a job ran, in order; the environment it ended with; and its ``actions/cache``
    steps' inputs (path, key, restore-keys), expanded."""

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.env = ctx.env
        self.caches: list[dict[str, str]] = []
        self.pull_requests: list[dict[str, str]] = []


#: What the runner says of itself (``runner.os``, ``runner.arch``), and this run's id.
RUNNER_OS, RUNNER_ARCH, RUN_ID = "Linux", "X64", "4242"


#: The payload GitHub writes for an event (``$GITHUB_EVENT_PATH``), where a step reads one.
EVENT_PAYLOADS = {"pull_request": Path(__file__).parent / "data" / "pull_request_synchronize.json"}


#: Every expression the workflow uses, and its value here.
EXPRESSIONS: dict[str, Callable[[Context], str]] = {
    "vars.PERFSUITE_WHEELHOUSE": lambda c: c.event.vars.get("PERFSUITE_WHEELHOUSE", ""),
    "vars.PERF_AB_KEYWORD": lambda c: c.event.vars.get("PERF_AB_KEYWORD", ""),
    "vars.PERF_MIN_EFFECT": lambda c: c.event.vars.get("PERF_MIN_EFFECT", ""),
    "vars.PERF_AB_MAX_PAIRS": lambda c: c.event.vars.get("PERF_AB_MAX_PAIRS", ""),
    "vars.PERF_BOOTSTRAP_BUDGET": lambda c: c.event.vars.get("PERF_BOOTSTRAP_BUDGET", ""),
    "steps.record.outputs.status": lambda c: c.outputs.get("record", {}).get("status", ""),
    "steps.record.outputs.code": lambda c: c.outputs.get("record", {}).get("code", ""),
    "secrets.PERF_PR_TOKEN || github.token": lambda _: "a-token",
    "github.server_url": lambda _: "https://github.example",
    "github.repository": lambda _: "team/repo",
    "(github.event_name == 'pull_request' || github.event_name == 'issue_comment') && 'pr' || 'nightly'": lambda c: (
        "pr" if c.event.name in ("pull_request", "issue_comment") else "nightly"
    ),
    "github.event_name == 'push' || github.event_name == 'schedule'": lambda c: str(
        c.event.name in ("push", "schedule")
    ).lower(),
    "github.event_name == 'pull_request' || github.event_name == 'issue_comment'": lambda c: str(
        c.event.name in ("pull_request", "issue_comment")
    ).lower(),
    "github.base_ref || github.event.repository.default_branch": lambda c: "main",
    "inputs.record": lambda c: c.event.inputs.get("record", ""),
    "inputs.keyword": lambda c: c.event.inputs.get("keyword", ""),
    "steps.profile.outputs.profile": lambda c: c.outputs.get("profile", {}).get("profile", ""),
    "github.workspace": lambda c: str(c.workspace),
    "github.run_id": lambda _: RUN_ID,
    "runner.os": lambda _: RUNNER_OS,
    "runner.arch": lambda _: RUNNER_ARCH,
    "steps.inductor.outputs.versions": lambda c: c.outputs.get("inductor", {}).get("versions", ""),
}


def _files_exist(root: Path, pattern: str) -> bool:
    return any(root.glob(pattern))


#: Every ``if:`` of a step, and whether it holds here (None: the default, success()).
CONDITIONS: dict[str, Callable[[Context, Path], bool]] = {
    "env.ASKED == 'true' && env.AB_KEYWORD != ''": lambda c, _: (
        c.env.get("ASKED") == "true" and bool(c.env.get("AB_KEYWORD")) and not c.failed
    ),
    "always() && env.PUBLISH == 'true' && hashFiles('perf-history/**') != ''": lambda c, r: (
        c.env.get("PUBLISH") == "true" and _files_exist(r, "perf-history/*/*.json")
    ),
    "always() && hashFiles('perf-results.json') != ''": lambda _, r: (r / "perf-results.json").exists(),
    "always() && env.ASKED == 'true' && hashFiles('perf-results.json') != ''": lambda c, r: (
        c.env.get("ASKED") == "true" and (r / "perf-results.json").exists()
    ),
    "always() && steps.record.outputs.status != ''": lambda c, _: bool(c.outputs.get("record", {}).get("status")),
}


def expand(text: str, ctx: Context) -> str:
    while "${{" in text:
        start = text.index("${{")
        end = text.index("}}", start)
        expression = text[start + 3 : end].strip()
        assert expression in EXPRESSIONS, f"the workflow uses ${{{{ {expression} }}}}: teach this test its value"
        text = text[:start] + EXPRESSIONS[expression](ctx) + text[end + 2 :]
    return text


def run_job(repo: Path, workflow: Mapping[str, Any], job: str, event: Event, env: Mapping[str, str]) -> Ran:
    """The job's ``run:`` steps, in order, with GitHub's semantics for ``if:`` and outputs."""
    spec = workflow["jobs"][job]
    ctx = Context(event, dict(env), repo)
    for scope in (workflow.get("env", {}), spec.get("env", {})):
        ctx.env.update({k: expand(str(v), ctx) for k, v in scope.items()})
    done = Ran(ctx)
    for index, step in enumerate(spec["steps"]):
        if "run" not in step:
            if step["uses"].startswith("actions/cache@") and not ctx.failed:
                done.caches.append({k: expand(str(v), ctx) for k, v in step["with"].items()})
            if step["uses"].startswith("peter-evans/create-pull-request@") and CONDITIONS[step["if"]](ctx, repo):
                done.pull_requests.append(
                    open_pull_request(repo, {k: expand(str(v), ctx) for k, v in step["with"].items()})
                )
            continue  # uses: the test does what these do
        condition = step.get("if")
        if condition is not None:
            assert condition in CONDITIONS, f"the workflow's step if: {condition!r}: teach this test what it means"
        if not (CONDITIONS[condition](ctx, repo) if condition else not ctx.failed):
            continue
        done.append(_run_step(repo, step, index, ctx))
    return done


def _run_step(repo: Path, step: Mapping[str, Any], index: int, ctx: Context) -> Step:
    out, exported = repo.parent / f"step-{index}.out", repo.parent / f"step-{index}.env"
    out.write_text("")
    exported.write_text("")
    env = {**ctx.env, **{k: expand(str(v), ctx) for k, v in step.get("env", {}).items()}}
    env.update(
        GITHUB_OUTPUT=str(out),
        GITHUB_ENV=str(exported),
        GITHUB_STEP_SUMMARY=str(repo.parent / "summary.md"),
        GITHUB_ACTIONS="true",
        GITHUB_EVENT_PATH=str(EVENT_PAYLOADS.get(ctx.event.name, os.devnull)),
    )
    script = expand(step["run"], ctx)
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if "id" in step:
        lines = [line.split("=", 1) for line in out.read_text().splitlines() if "=" in line]
        ctx.outputs[step["id"]] = dict(lines)
    ctx.env.update(dict(line.split("=", 1) for line in exported.read_text().splitlines() if "=" in line))
    ctx.failed |= done.returncode != 0
    return Step(step.get("name", step["run"][:40]), done.returncode == 0, done.stdout + done.stderr)


def open_pull_request(repo: Path, given: Mapping[str, str]) -> dict[str, str]:
    """What peter-evans/create-pull-request does here: a commit of ``add-paths`` on top of HEAD,
    force-pushed to ``branch`` (the workspace and its checkout stay as they are)."""
    index = repo.parent / "pr-index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    run = functools.partial(subprocess.run, cwd=repo, env=env, check=True, capture_output=True, text=True)
    run(["git", "read-tree", "HEAD"])
    run(["git", "add", "-A", "--", given["add-paths"].removesuffix("/**")])
    tree = run(["git", "write-tree"]).stdout.strip()
    commit = run(["git", "commit-tree", tree, "-p", "HEAD", "-m", given["commit-message"]]).stdout.strip()
    run(["git", "push", "-q", "-f", "origin", f"{commit}:refs/heads/{given['branch']}"])
    index.unlink()
    return {**given, "commit": commit}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """perfsuite's wheel, built from this checkout: the runner's only source of perfsuite."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(folder), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return folder


@pytest.fixture(scope="module")
def runner_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder standing for the runner's Python: this Python's base interpreter as ``python3`` on
    PATH, whose site-packages (what --system-site-packages reaches) hold this environment's
    packages but not perfsuite. Its ``python3 -m venv`` makes the venv with a .pth adding those
    site-packages, as --system-site-packages would, and without a pip of its own: Python 3.11's
    ensurepip would also put its old setuptools in front of the runner's, which torch refuses."""
    root = tmp_path_factory.mktemp("runner")
    site = root / "site-packages"
    site.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if "perfsuite" not in entry.name.lower():
            (site / entry.name).symlink_to(entry)
    (root / "bin").mkdir()
    base = Path(sys._base_executable).resolve()  # type: ignore[attr-defined]
    (root / "bin" / "python3").write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
  venv="${{!#}}"
  "{base}" -m venv --without-pip "$venv"
  purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "{site}" > "$purelib/runner-system-site.pth"
else
  exec "{base}" "$@"
fi
""")
    (root / "bin" / "python3").chmod(0o755)
    return root


#: A team's own root conftest.py, there before ``init`` (which keeps it and appends its note).
OWN_CONFTEST = "import pytest\n\n\n@pytest.fixture\ndef team_fixture():\n    return 42\n"


@pytest.fixture
def team(
    tmp_path: Path, runner_python: Path, wheelhouse: Path, request: pytest.FixtureRequest
) -> tuple[Path, dict[str, str], dict[str, Any]]:
    """A fresh clone of a team repository ``init`` set up (over its own conftest.py when the test is
    parametrized with ``own_conftest``), its remote, and the runner's environment."""
    seed, remote, repo = tmp_path / "seed", tmp_path / "origin.git", tmp_path / "runner" / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(seed))
    if getattr(request, "param", None) == "own_conftest":
        (seed / "conftest.py").write_text(OWN_CONFTEST)
    init(seed, Model.parse(None), force=False)
    git(seed, "add", "-A")
    git(seed, "-c", "user.name=team", "-c", "user.email=team@example.com", "commit", "-q", "-m", "perfsuite init")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    repo.parent.mkdir()
    git(tmp_path, "clone", "-q", str(remote), str(repo))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(
        PATH=f"{runner_python / 'bin'}:{os.environ['PATH']}",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        RUNNER_TOOL_CACHE=str(tmp_path / "runner" / "tool-cache"),
        PYTEST_ADDOPTS="--perf-op-profiles=off --perf-profile=cpu",
        GIT_AUTHOR_NAME="ci",
        GIT_AUTHOR_EMAIL="ci@example.com",
        GIT_COMMITTER_NAME="ci",
        GIT_COMMITTER_EMAIL="ci@example.com",
    )
    env.pop("GITHUB_ACTIONS", None)
    workflow = yaml.safe_load((repo / ".github" / "workflows" / "perf.yml").read_text())
    return repo, env, {"workflow": workflow, "vars": {"PERFSUITE_WHEELHOUSE": str(wheelhouse)}}


def job(team: tuple[Path, dict[str, str], dict[str, Any]], name: str, event: str, **inputs: str) -> Ran:
    repo, env, spec = team
    return run_job(repo, spec["workflow"], name, Event(event, inputs, spec["vars"]), env)


def failed(steps: list[Step]) -> list[str]:
    return [s.name for s in steps if not s.ok]


def merge(repo: Path, message: str) -> None:
    """What merging the record job's pull request does: its baselines on main."""
    git(repo, "add", "baselines")
    git(repo, "commit", "-q", "-m", message)
    git(repo, "push", "-q", "origin", "main")


def test_the_workflow_passes_actionlint_and_knows_every_expression(tmp_path: Path) -> None:
    from test_workflows import lint

    init(tmp_path, Model.parse(None), force=False)
    path = tmp_path / ".github" / "workflows" / "perf.yml"
    linted = lint(ROOT, path)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    workflow = yaml.safe_load(path.read_text())
    gate, record = workflow["jobs"]["gate"], workflow["jobs"]["record"]
    assert "head.repo.full_name == github.repository" in gate["if"]  # forks never reach the runner
    assert (
        workflow["concurrency"]["group"]
        == "perf-${{ github.event.pull_request.number || github.event.issue.number || github.run_id }}"
    )
    assert record["if"] == "github.event_name == 'workflow_dispatch'"
    assert any(s.get("uses", "").startswith("peter-evans/create-pull-request") for s in record["steps"])
    assert "contents" not in workflow["permissions"] or workflow["permissions"]["contents"] == "read"


def test_both_jobs_keep_inductors_cache_in_the_folder_the_ranks_compile_to(tmp_path: Path) -> None:
    """torch.compile's kernels survive the run: the workflow points inductor at a folder in the
    workspace (an installed perfsuite would use ~/.cache, which no step saves), and each job
    restores it before anything compiles and saves it after, keyed on what makes them stale."""
    init(tmp_path, Model.parse(None), force=False)
    workflow = yaml.safe_load((tmp_path / ".github" / "workflows" / "perf.yml").read_text())
    folder = workflow["env"]["TORCHINDUCTOR_CACHE_DIR"]
    for name, measures in (("gate", "Gate"), ("record", "Record")):
        steps = workflow["jobs"][name]["steps"]
        names = [s.get("name", "") for s in steps]
        caches = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
        assert len(caches) == 1, f"job {name}: no actions/cache step keeps inductor's kernels"
        kept = caches[0]["with"]
        assert folder == "${{ github.workspace }}/" + kept["path"]
        assert kept["key"] == kept["restore-keys"] + "${{ github.run_id }}"  # a run saves what it added
        assert names.index("Install perfsuite") < names.index("Inductor cache key") < steps.index(caches[0])
        assert steps.index(caches[0]) < names.index(measures)


@pytest.mark.serial  # its green run must pass as measured: a neighbouring test's launches would be contention
def test_a_fresh_runner_is_red_until_the_record_job_baselines_are_merged_then_green(team: Any) -> None:
    repo = team[0]
    first = job(team, "gate", "pull_request")
    assert failed(first) == ["Profile"], [s.output[-2000:] for s in first]
    assert "perfsuite: building" in first[0].output  # the runner's first run builds the environment
    said = first[-1].output
    assert "::error title=perfsuite cpu: not judged::no baselines for profile cpu" in said
    assert "record = bootstrap" in said
    recorded = job(team, "record", "workflow_dispatch", record="update", keyword="")
    assert failed(recorded) == [], [s.output[-3000:] for s in recorded]
    assert (repo / "baselines" / "cpu" / "example.json").is_file()
    merge(repo, "baselines of cpu")
    green = job(team, "gate", "pull_request")
    assert failed(green) == [], [s.output[-3000:] for s in green]
    assert "perfsuite: reusing" in recorded[0].output and "perfsuite: reusing" in green[0].output
    assert [s.name for s in green] == [
        "Install perfsuite",
        "Inductor cache key",
        "Profile",
        "Gate",
        "Job summary and HTML report",
        "Pull-request comment",
    ]
    assert (repo / "perf-report.html").is_file()
    # The comment the next step posts (or edits in place): this pull request's, from its event.
    from perfsuite.reports.html.comment import MARKER

    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert (repo / "perf-comment.md").read_text().startswith(f"{MARKER}\nperfsuite judged commit {head[:12]} of #42")
    # Inductor's cache: the folder the ranks were given is the one saved, under this runner's torch.
    import torch

    versions = f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__}"
    prefix = f"perf-inductor-{RUNNER_OS}-{RUNNER_ARCH}-{versions}-{torch.backends.cpu.get_cpu_capability()}-"
    for ran in (recorded, green):
        (cache,) = ran.caches
        assert ran.env["TORCHINDUCTOR_CACHE_DIR"] == str(repo / cache["path"])
        assert (cache["key"], cache["restore-keys"]) == (prefix + RUN_ID, prefix)


@pytest.mark.slow  # ~2 min: tiers, a planted slowdown and the shared history, end to end
def test_tiers_a_planted_slowdown_and_the_shared_history(team: Any) -> None:
    repo = team[0]
    tests = repo / "bench_tests" / "test_perf.py"
    tests.write_text(
        tests.read_text().replace(
            "\n]\n",
            '\n    Scenario("example", "ddp_fp32", MODEL, strategy="ddp", precision="fp32", tier="nightly", **SHAPE),\n]\n',
        )
    )
    git(repo, "commit", "-qam", "a nightly row")
    recorded = job(team, "record", "workflow_dispatch", record="update", keyword="")
    assert failed(recorded) == [], [s.output[-3000:] for s in recorded]
    merge(repo, "baselines of cpu, both tiers")
    nightly = job(team, "gate", "schedule")
    assert failed(nightly) == [], [s.output[-6000:] for s in nightly if not s.ok]
    on_branch = git(repo.parent.parent / "origin.git", "ls-tree", "-r", "--name-only", BRANCH).split()
    assert len(on_branch) == 1 and on_branch[0].startswith("cpu/")
    ran = json.loads((repo / "perf-results.json").read_text())
    assert {r["id"] for r in ran["results"]} == {"example.ddp", "example.ddp_fp32"}

    model = repo / "perf_models" / "example.py"
    # A blocking host call in every block's forward (a tiny model's extra FLOPs drown in its overhead).
    model.write_text(
        model.read_text().replace(
            "        return x + self.mlp(self.norm(x))",
            "        time.sleep(0.02)\n        return x + self.mlp(self.norm(x))",
        )
    )
    model.write_text("import time\n" + model.read_text())
    git(repo, "commit", "-qam", "a slower block")
    slowed = job(team, "gate", "pull_request")
    assert failed(slowed) == ["Gate"], [s.output[-6000:] for s in slowed if s.name == "Gate"]
    assert "example.ddp: regression" in next(s for s in slowed if s.name == "Gate").output
    ran = json.loads((repo / "perf-results.json").read_text())
    assert [r["id"] for r in ran["results"]] == ["example.ddp"]  # the pr tier only


def _tiny_wheel(folder: Path, version: str) -> None:
    """A one-module package's wheel, written by hand: what the install step's pip installs offline."""
    info = f"tinyperf-{version}.dist-info"
    with zipfile.ZipFile(folder / f"tinyperf-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr("tinyperf/__init__.py", f"VERSION = {version!r}\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: tinyperf\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        files = ["tinyperf/__init__.py", *(f"{info}/{name}" for name in ("METADATA", "WHEEL", "RECORD"))]
        wheel.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in files))


def test_the_environment_outlives_the_cleaned_workspace_and_a_new_requirement_builds_once(tmp_path: Path) -> None:
    """Every job installs perfsuite by the workflow's one script, which keeps the environment in the
    runner's tool cache: a second run, after checkout cleaned the workspace, reuses it without pip
    (pip's own log, PIP_LOG, does not grow); a build cancelled halfway is redone; a new requirement
    builds another, once, when two jobs on the machine start together. The runner's python3 here is
    this Python's base interpreter (a real venv, ensurepip included); the requirement a tiny wheel."""
    init(tmp_path / "team", Model.parse(None), force=False)
    workflow = yaml.safe_load((tmp_path / "team" / ".github" / "workflows" / "perf.yml").read_text())
    for name, spec in workflow["jobs"].items():
        runs = [s.get("run", "") for s in spec["steps"]]
        used = [i for i, run in enumerate(runs) if "$PERF_VENV" in run]
        assert used and runs.index('bash -eo pipefail -c "$PERF_INSTALL"') < used[0], name
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(Path(sys._base_executable).resolve())  # type: ignore[attr-defined]
    wheels, workspace, pip_log = tmp_path / "wheels", tmp_path / "workspace", tmp_path / "pip.log"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        _tiny_wheel(wheels, version)

    def install(requirement: str, job: str) -> subprocess.Popen[str]:
        workspace.mkdir(exist_ok=True)
        (workspace / ".perf-venv").mkdir(exist_ok=True)  # what a run leaves behind, for checkout to clean
        env = {
            "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
            "HOME": str(tmp_path / "home"),
            "RUNNER_TOOL_CACHE": str(tmp_path / "tool-cache"),
            "PERFSUITE_REQUIREMENT": requirement,
            "PERFSUITE_WHEELHOUSE": str(wheels),
            "PERF_INSTALL": workflow["env"]["PERF_INSTALL"],
            "GITHUB_ENV": str(tmp_path / f"{job}.env"),
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_LOG": str(pip_log),
        }
        (tmp_path / f"{job}.env").write_text("")
        step = next(s for s in workflow["jobs"]["gate"]["steps"] if s.get("name") == "Install perfsuite")
        return subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=workspace,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def ran(requirement: str, *jobs: str) -> list[tuple[str, Path, float]]:
        start = time.perf_counter()
        started = [(job, install(requirement, job)) for job in jobs]
        done = []
        for job, process in started:
            output = process.communicate(timeout=300)[0]
            seconds = time.perf_counter() - start
            assert process.returncode == 0, output
            (line,) = (tmp_path / f"{job}.env").read_text().splitlines()
            venv = Path(line.removeprefix("PERF_VENV="))
            version = subprocess.run(
                [str(venv / "bin" / "python"), "-c", "import tinyperf; print(tinyperf.VERSION)"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            assert requirement.endswith(version)
            done.append((output, venv, seconds))
        return done

    def cleaned() -> None:  # what actions/checkout does to the workspace (git clean -ffdx)
        shutil.rmtree(workspace)

    [(first, venv, built)] = ran("tinyperf==1.0", "first")
    assert "perfsuite: building" in first and pip_log.stat().st_size > 0
    assert venv.is_relative_to(tmp_path / "tool-cache") and not (tmp_path / "home").exists()
    logged = pip_log.stat().st_size
    cleaned()
    [(second, again, reused)] = ran("tinyperf==1.0", "second")
    assert "perfsuite: reusing" in second and again == venv
    assert pip_log.stat().st_size == logged  # no pip ran
    print(f"\ninstall step, measured here: first run {built:.2f} s (built), second {reused:.2f} s (reused)")
    # A build cancelled before it was marked complete is redone, not trusted.
    (venv / ".perfsuite-complete").unlink()
    cleaned()
    [(redone, _, _)] = ran("tinyperf==1.0", "third")
    assert "perfsuite: building" in redone and pip_log.stat().st_size > logged
    # A new requirement: another environment, built by one of two jobs starting together; the other
    # waits for the lock, then reuses it.
    cleaned()
    both = ran("tinyperf==2.0", "a", "b")
    assert both[0][1] == both[1][1] != venv
    said = sorted(("perfsuite: building" in o, "perfsuite: reusing" in o) for o, _, _ in both)
    assert said == [(False, True), (True, False)]
    kept = {p.name for p in (tmp_path / "tool-cache" / "perfsuite-venvs").iterdir() if p.is_dir()}
    assert kept == {venv.name, both[0][1].name}


def checkout(repo: Path) -> None:
    """What actions/checkout does to a self-hosted runner's workspace before a job: main as pushed,
    every untracked file gone (git clean -ffdx)."""
    git(repo, "fetch", "-q", "origin")
    git(repo, "checkout", "-q", "-f", "main")
    git(repo, "reset", "-q", "--hard", "origin/main")
    git(repo, "clean", "-ffdxq")


@pytest.mark.slow  # ~3 min: two bootstraps, a gate and a slowed gate, end to end
@pytest.mark.parametrize("team", ["own_conftest"], indirect=True)  # init over a team's own conftest.py
def test_a_bootstrap_that_runs_out_of_budget_loses_nothing_and_the_next_run_resumes_it(team: Any) -> None:
    repo, env, spec = team
    assert (repo / "conftest.py").read_text().startswith(OWN_CONFTEST)
    short = {**spec, "vars": {**spec["vars"], "PERF_BOOTSTRAP_BUDGET": "45s"}}
    first = job((repo, env, short), "record", "workflow_dispatch", record="bootstrap", keyword="")
    assert failed(first) == [], [s.output[-3000:] for s in first]
    record = next(s for s in first if s.name == "Record")
    assert "bootstrap incomplete" in record.output and "partial baselines" in record.output, record.output[-3000:]
    (pull,) = first.pull_requests
    assert pull["branch"] == "perf/baselines-cpu" and "(partial)" in pull["title"]
    on_branch = git(repo.parent.parent / "origin.git", "ls-tree", "-r", "--name-only", "perf/baselines-cpu")
    assert "baselines/cpu/bootstrap-state.json" in on_branch.split()

    checkout(repo)  # a later run: the workspace is clean, the partial work is on the branch only
    second = job(team, "record", "workflow_dispatch", record="bootstrap", keyword="")
    assert failed(second) == [], [s.output[-3000:] for s in second]
    assert (
        "resuming the bootstrap recorded on perf/baselines-cpu" in next(s for s in second if s.name == "Resume").output
    )
    record = next(s for s in second if s.name == "Record")
    assert "bootstrap complete" in record.output and "done in an earlier run" in record.output, record.output[-3000:]
    (pull,) = second.pull_requests
    assert "(complete)" in pull["title"]
    tree = git(repo.parent.parent / "origin.git", "ls-tree", "-r", "--name-only", "perf/baselines-cpu").split()
    assert "baselines/cpu/example.json" in tree and "baselines/cpu/bootstrap-state.json" not in tree

    checkout(repo)
    git(repo, "merge", "-q", "--ff-only", pull["commit"])  # the pull request merged
    git(repo, "push", "-q", "origin", "main")
    green = job(team, "gate", "pull_request")
    assert failed(green) == [], [s.output[-3000:] for s in green]
    model = repo / "perf_models" / "example.py"
    # A blocking host call in every block's forward, well beyond cpu's 40% tolerance (0.02 s, as the
    # tiers test plants, read about 40% slower after a bootstrap's calibration: caught in 3 runs of 5).
    model.write_text(
        "import time\n"
        + model.read_text().replace(
            "        return x + self.mlp(self.norm(x))",
            "        time.sleep(0.1)\n        return x + self.mlp(self.norm(x))",
        )
    )
    git(repo, "commit", "-qam", "a slower block")
    slowed = job(team, "gate", "pull_request")
    assert failed(slowed) == ["Gate"], [s.output[-6000:] for s in slowed if s.name == "Gate"]
    assert "example.ddp: regression" in next(s for s in slowed if s.name == "Gate").output
