"""Two real hosts: network namespaces joined by a veth pair, each with its own
hostname, one slurmd each (slurmctld on the first). ``--perf-launcher slurm``
starts a torchrun agent on each; they rendezvous at the first host's veth
address and run a two-stage pipeline whose stages talk over the link.

Needs root, ``ip netns`` and the Slurm packages (``bash
scripts/system-packages.sh``); skips otherwise, naming what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from cluster import (
    SLURM_BINARIES,
    Host,
    Node,
    SlurmCluster,
    job_state,
    module_processes,
    netns_pids,
    pytest_script,
    require,
    submit,
    two_hosts,
    wait_for,
    wait_job_done,
)
from conftest import CPU_PROFILE, rank_processes

from perfsuite.launch.torchrun import AGENT_MODULE

PIPELINE = """
from perfsuite import ModelSpec, Scenario, parametrize

GPT = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=256, max_positions=32)
SCENARIOS = [Scenario("parallel_3d", "pp2_two_hosts", GPT, strategy="tp_pp",
                      strategy_options={"pp": 2, "schedule": "gpipe", "microbatches": 2},
                      world_size=2, micro_batch=2, global_batch=4, seq_len=32, warmup_steps=1, steps=STEPS)]

@parametrize(SCENARIOS)
def test_bench(perf, scenario):
    perf.check(scenario)
"""
#: Both nodes, one rank on each: stage 0 on the first host, stage 1 on the second.
ALLOCATION = ("--nodes=2", "--ntasks-per-node=1")


@dataclass
class Hosts:
    cluster: SlurmCluster
    first: Host
    second: Host

    def namespace_of(self, pid: int) -> str:
        out = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()

    def strays(self) -> list[str]:
        """Processes in either namespace besides the cluster's own daemons."""
        daemons = {p.pid for p in self.cluster.daemons.procs}
        # slurmctld's own helper, which it forks at start and stops with itself.
        daemons |= {c.pid for p in daemons for c in psutil.Process(p).children() if c.name() == "slurmscriptd"}
        found = []
        for host in (self.first, self.second):
            for pid in netns_pids(host.netns):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if pid not in daemons:
                        proc = psutil.Process(pid)
                        found.append(f"{host.hostname}: {pid} {proc.status()} {' '.join(proc.cmdline())[:200]}")
        return found

    def wait_no_strays(self) -> None:
        left: list[str] = []

        def none_left() -> bool:
            left[:] = self.strays()
            return not left

        with contextlib.suppress(pytest.fail.Exception):
            wait_for("no process left on either host", none_left, 10)
        assert not left, "processes left on the hosts:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    require(SLURM_BINARIES)
    root = SlurmCluster.folder(tmp_path_factory)
    with two_hosts(root) as (first, second):
        nodes = [Node(h.hostname, h.addr, tuple(h.prefix())) for h in (first, second)]
        cluster = SlurmCluster(root, nodes)
        try:
            cluster.start()
            yield Hosts(cluster, first, second)
        finally:
            cluster.stop()


def submit_pipeline(hosts: Hosts, project: pytest.Pytester, steps: int, *args: str) -> tuple[str, Path]:
    project.makepyfile(test_bench=PIPELINE.replace("STEPS", str(steps)))
    basetemp = f"--basetemp={project.path / 'tmp'}"  # on the filesystem both hosts share
    script = pytest_script(
        project.path / "job.sh",
        project.path,
        # The launch is under test, not the judgement: no baseline here, and that must not fail the job.
        ["-rA", CPU_PROFILE, "--perf-launcher=slurm", "--perf-allow-unjudged", basetemp, *args],
    )
    log = project.path / "job.out"
    return submit(hosts.cluster, script, *ALLOCATION, f"--output={log}"), log


def ranks_by_host(hosts: Hosts, project: pytest.Pytester, job_id: str, log: Path) -> dict[str, int]:
    """Namespace -> pid of the rank running there, once there is one on each host."""
    found: dict[str, int] = {}

    def up() -> bool:
        if job_state(hosts.cluster, job_id) not in ("PENDING", "RUNNING"):
            pytest.fail(f"job {job_id} ended before both ranks were seen:\n{log.read_text()}")
        found.clear()
        for proc in rank_processes(project.path).values():
            found[hosts.namespace_of(proc.pid)] = proc.pid
        return set(found) == {hosts.first.netns, hosts.second.netns}

    wait_for("a rank on each host", up, 60, [log])
    return found


def measuring(basetemp: Path) -> int:
    """Ranks of the run under ``basetemp`` whose last phase is a timed step."""
    # Resolved: pytest's ``perfsuitecurrent`` symlink names the same files again.
    phases = {p.resolve() for p in basetemp.glob("perfsuite*/*/reports/rank*.phase")}
    return sum(p.read_text().startswith("measure") for p in phases)


def test_two_hosts_run_a_pipeline_over_the_veth_link(hosts: Hosts, project: pytest.Pytester) -> None:
    out = project.path / "r.json"
    sent_before = hosts.second.tx_bytes()
    job_id, log = submit_pipeline(hosts, project, 3, f"--perf-json={out}")
    ranks_by_host(hosts, project, job_id, log)  # one rank in each namespace
    assert wait_job_done(hosts.cluster, job_id, 90) == "COMPLETED", log.read_text()
    assert "1 skipped" in log.read_text(), log.read_text()  # no baseline: it trained and was measured
    (res,) = json.loads(out.read_text())["results"]
    assert res["status"] == "ok" and res["config"]["layout"]["pp"] == 2
    # Each stage ran on its own host, as that host's namespace names itself.
    assert res["launch"]["ranks_per_host"] == {hosts.first.hostname: 1, hosts.second.hostname: 1}
    assert res["launch"]["launcher"] == "slurm" and res["launch"]["nnodes"] == 2
    # The rendezvous, gloo and the stage-to-stage activations crossed the veth:
    # far more than the few KiB of Slurm messages the second host sends.
    assert hosts.second.tx_bytes() - sent_before > 200_000
    hosts.wait_no_strays()


def test_killing_one_hosts_agent_ends_the_other_side_classified(hosts: Hosts, project: pytest.Pytester) -> None:
    out = project.path / "r.json"
    job_id, log = submit_pipeline(hosts, project, 100_000, f"--perf-json={out}", "--perf-timeout=120")
    ranks_by_host(hosts, project, job_id, log)
    # Mid-run: both stages in their timed steps, exchanging activations.
    phases = project.path / "tmp"
    wait_for("both ranks measuring", lambda: measuring(phases) == 2, 90, [log])
    (agent,) = [
        p for p in module_processes(project.path, AGENT_MODULE) if hosts.namespace_of(p.pid) == hosts.second.netns
    ]
    killed = time.monotonic()
    with contextlib.suppress(psutil.NoSuchProcess):
        os.kill(agent.pid, signal.SIGKILL)
    # pytest ends, failing the scenario, long before its 120 s timeout.
    assert wait_job_done(hosts.cluster, job_id, 60) == "FAILED", log.read_text()
    assert time.monotonic() - killed < 60
    (res,) = json.loads(out.read_text())["results"]
    assert res["status"] == "crash" and res["failure"]["phase"].startswith("measure"), res
    text = log.read_text()
    assert "1 failed" in text, text
    hosts.wait_no_strays()
