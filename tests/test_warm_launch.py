"""Warm launches (``rank_start=warm``, :mod:`perfsuite.launch.warm`): the agent forked from a parent
that imported everything once, the ranks from the agent. What must not change: the numbers a
launch trains, and the process a rank runs in; a dead parent costs a note, not the run."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from perfsuite import ModelSpec, Scenario
from perfsuite.core.protocol import RankJob, RankStart
from perfsuite.launch import warm
from perfsuite.launch.base import LaunchOutcome, WorkerJob
from perfsuite.launch.torchrun import LocalTorchrun
from perfsuite.rank.worker import warmparent
from perfsuite.rank.worker.fresh import blas_threads

#: A team model (ModelSpec.module) whose ranks write down the process they were built in.
PROBE = textwrap.dedent(
    """
    import gc, json, os, resource, signal, sys

    import torch
    from torch import nn

    from perfsuite.rank.models.module import Recipe


    def facts():
        env = dict(os.environ)
        import threadpoolctl

        handlers = {}
        for sig in signal.valid_signals():
            handler = signal.getsignal(sig)
            handlers[int(sig)] = handler if isinstance(handler, int) else getattr(handler, "__qualname__", "?")
        return {
            "env": env,
            "threads": [torch.get_num_threads(), torch.get_num_interop_threads(),
                        sorted((p["internal_api"], p["num_threads"]) for p in threadpoolctl.threadpool_info())],
            "signals": handlers,
            "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
            "affinity": sorted(os.sched_getaffinity(0)),
            "gc": [gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()],
            "backends": [torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled(),
                         str(torch.get_default_dtype()), torch.backends.cpu.get_cpu_capability(),
                         torch.is_grad_enabled(), torch.get_float32_matmul_precision()],
            "cwd": os.getcwd(),
            "path": sys.path,
            "umask": os.umask(0o22),
            "flags": list(sys.flags),
        }


    def build(device, dtype, width=8):
        if device.type != "meta":
            with open(os.path.join(os.environ["PROBE_OUT"], f"rank{os.environ['RANK']}.json"), "w") as out:
                json.dump(facts(), out, default=str)
        model = nn.Linear(width, width).to(device=device, dtype=dtype)

        def batch(rows, seq_len, gen):
            return {"input": torch.randn(rows, width, generator=gen)}

        return Recipe(model, batch, loss=lambda out, b: out.float().pow(2).mean(), inputs=("input",))
    """
)
BUDGET_MIB = 675
SHAPE = dict(world_size=2, micro_batch=2, global_batch=4, seq_len=8, warmup_steps=1, steps=3)
#: Keys every launch sets anew, and the one a forking agent sets on purpose (agent.NVML_CHECK).
PER_LAUNCH = {
    "MASTER_PORT",
    "PERFSUITE_AGENT_MARKS",
    "PERFSUITE_RUN_TOKEN",
    "PROBE_OUT",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_RUN_ID",
}
FORK_ONLY = {"PYTORCH_NVML_BASED_CUDA_CHECK"}


def launch(
    scenario: Scenario, start: RankStart, work: Path, budget_mib: int | None = None, **env: str
) -> LaunchOutcome:
    """One launch of ``scenario`` on cpu, its ranks started as ``start``."""
    work.mkdir(parents=True)
    job = RankJob(
        spec=scenario.rank_spec(),
        device="cpu",
        reports_dir=str(work / "reports"),
        imports=scenario.rank_imports(),
        rank_memory_budget_mib=budget_mib,
    )
    return LocalTorchrun().run(WorkerJob(job, scenario.world_size, 120, work, env, rank_start=start))


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    """The probe model's scenario; the working directory holds its module, as a team's checkout would."""
    (tmp_path / "probe_model.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # for the spec's own check of the build function
    return Scenario("warm", "probe", ModelSpec.module("probe_model:build"), **SHAPE)


def probed(scenario: Scenario, start: RankStart, root: Path) -> tuple[LaunchOutcome, list[dict[str, Any]]]:
    out = root / f"facts-{start}"
    out.mkdir()
    outcome = launch(scenario, start, root / start, BUDGET_MIB, PROBE_OUT=str(out))
    assert outcome.status == "ok", outcome.failure and outcome.failure.describe()
    return outcome, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_warm_rank_trains_the_same_steps_in_the_same_process_as_an_exec_one(probe: Scenario, tmp_path: Path) -> None:
    """Same seed, same thread counts: bit-identical losses and model state; and the same process
    state, less what each launch sets anew and the NVML check a forking agent sets."""
    execd, exec_facts = probed(probe, "exec", tmp_path)
    forked_ranks, fork_facts = probed(probe, "fork", tmp_path)
    warmed, warm_facts = probed(probe, "warm", tmp_path)
    assert (execd.started, warmed.started, warmed.start_note) == ("exec", "warm", "")
    for other in (execd, forked_ranks):
        assert [r.losses for r in warmed.reports] == [r.losses for r in other.reports]
        assert [r.model_state for r in warmed.reports] == [r.model_state for r in other.reports]
    assert all(r.forked for r in warmed.reports) and not any(r.forked for r in execd.reports)
    for rank, (fresh, forked, fork) in enumerate(zip(exec_facts, warm_facts, fork_facts, strict=True)):
        fresh_env, forked_env = fresh.pop("env"), forked.pop("env")
        assert set(forked_env) - set(fresh_env) <= FORK_ONLY, rank
        assert set(fresh_env) <= set(forked_env), rank
        assert {k for k in fresh_env if fresh_env[k] != forked_env[k]} <= PER_LAUNCH, rank
        # The memory budget starts from the footprint once the row's libraries are imported, which a
        # warm rank inherits and another imports first. A rank forked from its agent (warm, fork) also
        # holds the agent's torchrun (42 MiB of VmData here): warm draws fork's line, to a few pages.
        (line, _), (fork_line, _) = forked["rlimits"].pop("RLIMIT_DATA"), fork["rlimits"]["RLIMIT_DATA"]
        (exec_line, _) = fresh["rlimits"].pop("RLIMIT_DATA")
        assert abs(line - fork_line) < 8 * 2**20 and abs(line - exec_line) < 64 * 2**20, (
            rank,
            line,
            fork_line,
            exec_line,
        )
        assert forked == fresh, rank
    # A team's own module is not preloaded: it is the code under test, imported afresh by every rank.
    assert warmed.warm["preloaded"] == ["perfsuite.rank.strategies.ddp", "perfsuite.rank.worker.train", "torch._dynamo"]


def test_two_trees_that_shadow_nothing_fork_from_one_parent_each_rank_on_its_own_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ab-rev's sides: a team's repository at two revisions. Their launches fork from one parent, so
    no state of a parent can favour a side, and each rank imports its own tree's modules, on the
    path an exec'd rank of that tree has."""
    facts: dict[str, list[dict[str, Any]]] = {}
    parents = set()
    for side, start in (("base", "warm"), ("candidate", "warm"), ("candidate", "exec")):
        tree = tmp_path / side
        tree.mkdir(exist_ok=True)
        (tree / "probe_model.py").write_text(PROBE)
        monkeypatch.chdir(tree)
        monkeypatch.syspath_prepend(str(tree))
        scenario = Scenario("warm", "probe", ModelSpec.module("probe_model:build"), **SHAPE)
        out = tmp_path / f"facts-{side}-{start}"
        out.mkdir()
        outcome = launch(scenario, start, out / "work", BUDGET_MIB, PROBE_OUT=str(out), PYTHONPATH=str(tree))
        assert outcome.status == "ok", outcome.failure and outcome.failure.describe()
        facts[f"{side}-{start}"] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        parents.add(outcome.warm.get("parent_pid") if outcome.warm else None)
    assert len(parents - {None}) == 1  # both trees' warm launches
    for rank in range(2):
        warmed, execd = facts["candidate-warm"][rank], facts["candidate-exec"][rank]
        assert warmed["cwd"] == execd["cwd"] == str(tmp_path / "candidate")
        assert warmed["path"] == execd["path"] and str(tmp_path / "base") not in warmed["path"]


def test_a_tree_holding_an_installed_package_gets_a_parent_of_its_own(tmp_path: Path) -> None:
    """A tree with its own copy of a package the parent imports (perfsuite's own repository at two
    revisions) shadows it: a parent that imported another copy cannot serve it."""
    for name in ("team", "repo"):
        (tmp_path / name / "perf_models").mkdir(parents=True)
        (tmp_path / name / "perf_models" / "__init__.py").write_text("")
    (tmp_path / "repo" / "perfsuite").mkdir()
    (tmp_path / "repo" / "torch.py").write_text("")
    preload = ["perfsuite.rank.worker.train"]
    assert warm.shadowed(preload, None, str(tmp_path / "team")) == ()
    assert warm.shadowed(preload, str(tmp_path / "repo"), str(tmp_path / "team")) == (
        ("perfsuite", str(tmp_path / "repo" / "perfsuite")),
        ("torch", str(tmp_path / "repo" / "torch.py")),
    )
    env = {"OMP_NUM_THREADS": "1"}
    team = warm.ParentKey.of("py", preload, {**env, "PYTHONPATH": str(tmp_path / "team")}, str(tmp_path / "team"))
    again = warm.ParentKey.of("py", preload, {**env, "PYTHONPATH": "elsewhere"}, str(tmp_path))
    assert team == again and team.digest() == again.digest()
    repo = warm.ParentKey.of("py", preload, {**env, "PYTHONPATH": str(tmp_path / "repo")}, str(tmp_path / "repo"))
    assert repo != team and repo.digest() != team.digest()


def test_a_warm_bert_trains_the_same_steps_with_transformers_preloaded(tmp_path: Path) -> None:
    bert = Scenario("warm", "bert", ModelSpec("bert", 1, 32, 2, 512, 32), **SHAPE)
    execd, warmed = launch(bert, "exec", tmp_path / "exec"), launch(bert, "warm", tmp_path / "warm")
    assert execd.status == warmed.status == "ok"
    assert warmed.started == "warm"
    assert "transformers.models.bert.modeling_bert" in warmed.warm["preloaded"]
    assert [r.losses for r in warmed.reports] == [r.losses for r in execd.reports]
    assert [r.model_state for r in warmed.reports] == [r.model_state for r in execd.reports]


TINY = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)


def test_a_dead_parent_costs_one_launch_its_warm_start_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while an agent it forked measures: that launch ends as usual. Dead at the next launch:
    that one starts its agent fresh, saying why; the one after has a new parent. A parent stays one
    thread, and its memory does not grow with the launches it serves."""
    monkeypatch.setenv(warm.SHARED_VAR, str(warm.share_with_children()))
    scenario = Scenario("warm", "tiny", TINY, **SHAPE)
    first = launch(scenario, "warm", tmp_path / "first")
    assert first.status == "ok" and first.started == "warm"
    parent = psutil.Process(first.warm["parent_pid"])
    rss = parent.memory_info().rss
    struck = threading.Thread(target=kill_when_measuring, args=(parent, tmp_path / "during" / "reports"))
    struck.start()
    during = launch(Scenario("warm", "long", TINY, **{**SHAPE, "steps": 200}), "warm", tmp_path / "during")
    struck.join()
    assert during.status == "ok" and during.started == "warm", during.failure and during.failure.describe()
    assert not psutil.wait_procs([parent], timeout=5)[1], "the parent outlived its SIGKILL"
    after = launch(scenario, "warm", tmp_path / "after")
    assert after.status == "ok" and after.started == "fork"
    assert f"the warm parent (pid {parent.pid}) died" in after.start_note
    again = launch(scenario, "warm", tmp_path / "again")
    assert again.status == "ok" and again.started == "warm" and again.warm["started_for_this_launch"]
    fresh = psutil.Process(again.warm["parent_pid"])
    for n in range(2):
        assert launch(scenario, "warm", tmp_path / f"more{n}").started == "warm"
    assert fresh.num_threads() == 1
    assert fresh.memory_info().rss < rss + 8 * 2**20


def kill_when_measuring(parent: psutil.Process, reports: Path) -> None:
    """SIGKILL ``parent`` once rank 0 of the launch reporting to ``reports`` measures."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        phase = reports / "rank0.phase"
        if phase.exists() and phase.read_text().startswith("measure"):
            parent.send_signal(signal.SIGKILL)
            return
        time.sleep(0.01)


def test_a_parent_refuses_to_fork_with_a_second_thread_or_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before every fork: a CUDA context or another thread's locks would be copied."""
    monkeypatch.setattr(warmparent, "threads", lambda: 1)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert warmparent.fork_refusal() is None
    cuda = SimpleNamespace(is_initialized=lambda: True, _is_compiled=lambda: True, _is_in_bad_fork=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    assert "initialised CUDA" in (warmparent.fork_refusal() or "")
    cuda.is_initialized = lambda: False  # asked the driver (cudaGetDeviceCount): forks are marked bad
    assert "asked the CUDA driver" in (warmparent.fork_refusal() or "")
    cuda._is_in_bad_fork = lambda: False
    assert warmparent.fork_refusal() is None
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(warmparent, "threads", lambda: 3)
    assert "runs 3 threads" in (warmparent.fork_refusal() or "")


def test_a_parent_that_cannot_start_says_why(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no torch here' >&2\nexit 3\n")
    python.chmod(0o755)
    with pytest.raises(warm.WarmUnavailable, match=r"(?s)did not start \(it exited with status 3\).*no torch here"):
        warm.WarmParent.start(warm.ParentKey(str(python), (), ()), tmp_path, warm._owner())


def test_a_parent_ends_when_its_owner_does(tmp_path: Path) -> None:
    owner = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        parent = warm.WarmParent.start(warm.ParentKey(sys.executable, (), ()), tmp_path, warm._owner(owner.pid))
        assert parent.alive()
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 5
    while parent.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not parent.alive()


def test_what_a_parent_is_keyed_on() -> None:
    """One parent per interpreter, import set and import-time environment; other variables are per launch."""
    env = {"PATH": "/bin", "HOME": "/root", "OMP_NUM_THREADS": "1"}
    key = warm.ParentKey.of("py", ["b", "a", "a"], env)
    assert key == warm.ParentKey.of("py", ["a", "b"], {**env, "HOME": "/tmp", "PERFSUITE_RUN_TOKEN": "x"})
    assert key.preload == ("a", "b")
    assert key != warm.ParentKey.of("py", ["a", "b"], {**env, "OMP_NUM_THREADS": "2"})
    # glibc reads its allocator's settings when a process starts, and a fork keeps its parent's: a
    # launch that sets them gets a parent started with them (a shared parent without them ran a
    # slow self-test's FSDP2 ranks out of their data limit).
    assert key != warm.ParentKey.of("py", ["a", "b"], {**env, "MALLOC_MMAP_THRESHOLD_": str(2**20)})
    assert key != warm.ParentKey.of("py", ["a", "b"], {**env, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert key != warm.ParentKey.of("py", ["a"], env)
    assert key.digest() == warm.ParentKey.of("py", ["a", "b"], env).digest()


def test_the_blas_pool_is_sized_as_a_fresh_interpreter_would_size_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert blas_threads({"OMP_NUM_THREADS": "1"}) == 1
    assert blas_threads({"OPENBLAS_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}) == 3
    assert blas_threads({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "2"}) == 2
    assert blas_threads({}) == len(os.sched_getaffinity(0))


def test_a_shared_folder_gone_with_its_owner_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(warm.SHARED_VAR, str(tmp_path / "gone"))
    key = warm.ParentKey.of(sys.executable, ["nothing.at.all"], {})
    with pytest.raises(warm.WarmUnavailable, match="no warm parent could be started"):
        warm.parent_for(key)


def test_a_sitecustomize_in_the_checkout_runs_in_a_warm_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter runs sitecustomize at its start; a warm parent started elsewhere did not see the
    team's, so its forked agent runs it, with the launch's environment (a hook may read it)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nopen(os.path.join(os.getcwd(), f'hook-{os.getpid()}'), 'w').write(os.environ.get('MARK', ''))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # where an interpreter's start finds it (pytester's way)
    outcome = launch(Scenario("warm", "hooked", TINY, **SHAPE), "warm", tmp_path / "run", MARK="launch")
    assert outcome.status == "ok" and outcome.started == "warm"
    written = {path.name: path.read_text() for path in tmp_path.glob("hook-*")}
    # Once, in the agent (its ranks inherit what it did), with the launch's environment; not in the parent.
    assert list(written.values()) == ["launch"], written
    assert f"hook-{outcome.warm['parent_pid']}" not in written
