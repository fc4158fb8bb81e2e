"""``--perf-launcher slurm`` in a real allocation: a one-machine Slurm cluster
(Debian's slurmctld, slurmd and munge) on loopback, started and stopped here.

Needs root and the packages (``bash scripts/system-packages.sh``); skips
otherwise, naming what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cluster import (
    SLURM_BINARIES,
    Node,
    SlurmCluster,
    job_state,
    module_processes,
    pytest_script,
    require,
    submit,
    wait_for,
    wait_job_done,
)
from conftest import CPU_PROFILE, TINY_SHAPE, bench_module, leftover_workers, rank_processes

from perfsuite.launch.torchrun import AGENT_MODULE

ONE = f'Scenario("tiny", "fp32", TINY, {TINY_SHAPE}),'
LONG = 'Scenario("tiny", "long", TINY, world_size=2, micro_batch=8, global_batch=16, seq_len=32, steps=100000),'
#: One node whose two tasks are the scenario's two ranks (SLURM_NTASKS_PER_NODE).
ALLOCATION = ("--nodes=1", "--ntasks-per-node=2")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require(SLURM_BINARIES)
    cluster = SlurmCluster(SlurmCluster.folder(tmp_path_factory), [Node("localhost", "127.0.0.1")])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rdzv_port() -> Iterator[None]:
    """SlurmLauncher's rendezvous port comes from the job ID, and every test
    cluster numbers its jobs from 1: two on this machine (pytest -n 2) take
    turns rather than meet on one port."""
    with open("/tmp/perfsuite-test-slurm-rdzv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def batch(project: pytest.Pytester, *args: str) -> Path:
    """A batch script that runs the project's benchmarks with the slurm launcher."""
    basetemp = f"--basetemp={project.path / 'tmp'}"  # also marks every process of the run
    # The allocation and launch are under test, not the judgement: no baseline here must not fail the job.
    return pytest_script(
        project.path / "job.sh",
        project.path,
        ["-rA", CPU_PROFILE, "--perf-launcher=slurm", "--perf-allow-unjudged", basetemp, *args],
    )


def slurm_env_of_ranks(slurm: SlurmCluster, job_id: str, marker: Path, log: Path) -> list[dict[str, str]]:
    """The Slurm variables of the run's two rank processes, once both are up."""
    found: list[dict[str, str]] = []

    def up() -> bool:
        if job_state(slurm, job_id) not in ("PENDING", "RUNNING"):
            pytest.fail(f"job {job_id} ended before its ranks were seen:\n{log.read_text()}")
        found.clear()
        for proc in rank_processes(marker).values():
            with contextlib.suppress(psutil.Error):
                found.append({k: v for k, v in proc.environ().items() if k.startswith("SLURM_")})
        return len(found) == 2

    wait_for("2 ranks running", up, 60, [log])
    # One torchrun agent (srun's single task on the node) runs both ranks.
    agents = module_processes(marker, AGENT_MODULE)
    assert len(agents) == 1, [p.info["cmdline"] for p in agents]
    return found


def test_a_scenario_runs_in_a_real_allocation(slurm: SlurmCluster, project: pytest.Pytester, rdzv_port: None) -> None:
    """sbatch runs pytest; its launcher's srun step starts the torchrun agent
    whose two ranks train the scenario, and the results record it."""
    project.makepyfile(test_bench=bench_module(ONE))
    out = project.path / "r.json"
    log = project.path / "job.out"
    job_id = submit(slurm, batch(project, f"--perf-json={out}"), *ALLOCATION, f"--output={log}")
    ranks = slurm_env_of_ranks(slurm, job_id, project.path, log)
    # Inside the job, and in a step of it (srun), not in the batch script itself.
    assert all(env["SLURM_JOB_ID"] == job_id and env["SLURM_STEP_ID"] == "0" for env in ranks), ranks
    assert wait_job_done(slurm, job_id, 90) == "COMPLETED", log.read_text()
    text = log.read_text()
    assert "1 skipped" in text, text  # no baseline: it trained and was measured
    (res,) = json.loads(out.read_text())["results"]
    assert res["status"] == "ok" and res["verdict"] == "no_baseline"
    launch = res["launch"]
    assert launch["launcher"] == "slurm" and launch["nnodes"] == 1 and list(launch["ranks_per_host"].values()) == [2]


def test_scancel_leaves_no_rank_behind(slurm: SlurmCluster, project: pytest.Pytester, rdzv_port: None) -> None:
    project.makepyfile(test_bench=bench_module(LONG))
    log = project.path / "job.out"
    job_id = submit(slurm, batch(project, "--perf-timeout=300"), *ALLOCATION, f"--output={log}")
    slurm_env_of_ranks(slurm, job_id, project.path, log)
    assert job_state(slurm, job_id) == "RUNNING"
    cancel = slurm.client("scancel", job_id)
    assert cancel.returncode == 0, cancel.stderr
    start = time.monotonic()
    wait_for("every process of the cancelled job gone", lambda: not leftover_workers(project.path), 10, [log])
    assert time.monotonic() - start < 10
    wait_for(f"job {job_id} cancelled", lambda: job_state(slurm, job_id) == "CANCELLED", 10)
