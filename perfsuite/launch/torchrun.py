"""Launch through PyTorch's elastic launcher (torchrun).

One torchrun agent per node; agents rendezvous through a c10d endpoint. The
``local`` launcher is one agent on this machine. ``torchrun`` with ``nnodes >
1`` starts ``local_agents`` of the agents here: all of them to emulate several
nodes on one host (the loopback test), or one per host when each node runs its
own pytest. Each agent logs under ``logs/node<i>``, so a global rank maps to
its node and local rank for the stderr tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from perfsuite.core.protocol import RankStart
from perfsuite.launch import warm
from perfsuite.launch.base import Launcher, LaunchOutcome, WorkerJob, classify
from perfsuite.launch.procs import TOKEN_VAR, dump_worker_stacks, kill_tagged

#: torchrun's main, minus the interpreter teardown.
AGENT_MODULE = "perfsuite.rank.worker.agent"


class TopologyError(ValueError):
    """The requested nodes x ranks do not match the scenario."""


def free_port() -> int:
    """A TCP port free right now on loopback, for this run's rendezvous."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free right now on loopback.

    Every socket stays bound until all are chosen: the kernel picks a port to
    bind at random, so two ``free_port()`` calls in a row can return the same
    one once the first socket is closed (it happened: a test Slurm cluster got
    slurmctld's port for its slurmd too).
    """
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


@dataclass(frozen=True)
class Topology:
    nnodes: int = 1
    nproc_per_node: int | None = None  # default: world_size / nnodes
    rdzv_endpoint: str | None = None  # default: a free loopback port (single host)
    local_agents: int | None = None  # agents started here; default: all nnodes
    #: Slurm: ``nnodes`` is the allocation and ``nproc_per_node`` what a node
    #: holds; a scenario takes as many nodes as its world size needs.
    flexible: bool = False

    def layout(self, world_size: int) -> tuple[int, int]:
        """(nodes, ranks per node) of a run of ``world_size`` ranks."""
        if self.flexible:
            return self._fit(world_size)
        per_node = self.nproc_per_node or world_size // self.nnodes
        if per_node * self.nnodes != world_size:
            raise TopologyError(
                f"{self.nnodes} node(s) x {per_node} rank(s) per node != world_size {world_size}; "
                "adjust --perf-nnodes / --perf-nproc-per-node"
            )
        return self.nnodes, per_node

    def _fit(self, world_size: int) -> tuple[int, int]:
        holds = self.nproc_per_node or 1
        nodes = -(-world_size // holds)
        if nodes > self.nnodes:
            raise TopologyError(
                f"world_size {world_size} needs {nodes} node(s) of {holds} rank(s); the allocation has {self.nnodes}"
            )
        if world_size % nodes:
            raise TopologyError(f"world_size {world_size} does not split evenly over {nodes} nodes of {holds} ranks")
        return nodes, world_size // nodes

    def ranks_per_node(self, world_size: int) -> int:
        return self.layout(world_size)[1]

    def agents_here(self, nodes: int) -> int:
        """Agents this host starts for a run on ``nodes`` nodes."""
        return min(self.local_agents, nodes) if self.local_agents is not None else nodes

    @property
    def hosts_sharing(self) -> int:
        """Agents that share this host's GPUs (emulated nodes), at the most."""
        return self.local_agents if self.local_agents is not None else self.nnodes


class TorchrunLauncher(Launcher):
    name = "torchrun"
    #: Whether its commands are the agents themselves (``python -m AGENT ...``), which a warm parent can fork.
    agents_here: ClassVar[bool] = True

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology or Topology()

    def agent_command(self, job: WorkerJob, endpoint: str, run_id: str, node: int) -> list[str]:
        """``python -m perfsuite.rank.worker.agent ...`` (torchrun, :mod:`perfsuite.rank.worker.agent`) for the agent of one node."""
        nodes, per_node = self.topology.layout(job.world_size)
        return [
            job.python,
            "-m",
            AGENT_MODULE,
            "--nnodes",
            str(nodes),
            "--nproc-per-node",
            str(per_node),
            *self.rendezvous(nodes, endpoint, run_id),
            "--max-restarts",
            "0",
            "--log-dir",
            str(job.logs_dir / f"node{node}"),
            "--redirects",
            "3",
            *(["--start-method", "fork"] if job.rank_start in ("fork", "warm") else []),
            "-m",
            "perfsuite.rank.worker",
            str(job.spec_path),
        ]

    def rendezvous(self, nodes: int, endpoint: str, run_id: str) -> list[str]:
        """torchrun's rendezvous arguments. One node at a loopback port of perfsuite's choosing meets
        there statically, as plain ``torchrun --nproc-per-node`` does: the agent's store is the
        ranks' (c10d's join took 0.14-0.57 s of a launch on 2 cores, static 0.03-0.04 s: the lab
        notes, launch overhead). Nodes, or an endpoint someone chose, meet through c10d."""
        if nodes == 1 and self.topology.rdzv_endpoint is None:
            host, _, port = endpoint.rpartition(":")
            return ["--rdzv-backend", "static", "--master-addr", host, "--master-port", port, "--node-rank", "0"]
        return ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]

    def commands(self, job: WorkerJob, endpoint: str, run_id: str) -> list[list[str]]:
        nodes, _ = self.topology.layout(job.world_size)
        return [self.agent_command(job, endpoint, run_id, node) for node in range(self.topology.agents_here(nodes))]

    def agent_env(self, job: WorkerJob, node: int) -> dict[str, str]:
        """Environment of this host's agent ``node``. Emulated nodes on one GPU
        host get disjoint GPUs: each agent numbers its ranks' GPUs from 0, so
        without this every node's local rank 0 would take GPU 0 (NCCL refuses)."""
        nodes, per_node = self.topology.layout(job.world_size)
        agents = self.topology.agents_here(nodes)
        if job.rank_job.device != "cuda" or agents == 1:
            return {}
        if len(job.devices) < agents * per_node:
            raise TopologyError(
                f"emulating {agents} nodes of {per_node} rank(s) on this host needs {agents * per_node} GPUs; "
                f"it has {len(job.devices)}"
            )
        return {"CUDA_VISIBLE_DEVICES": ",".join(job.devices[node * per_node : (node + 1) * per_node])}

    def endpoint(self) -> str:
        return self.topology.rdzv_endpoint or f"127.0.0.1:{free_port()}"

    def warm_parent(self, job: WorkerJob, env: Mapping[str, str]) -> tuple[WarmStart | None, str]:
        """The warm parent that forks this launch's agent, or None and why not ("" when the job did
        not ask for one). Multi-node launches, and ranks in another Python environment, start exec'd."""
        if job.rank_start != "warm":
            return None, ""
        if not self.agents_here:
            return None, f"the {self.name} launcher starts each node's agent itself"
        if not sys.platform.startswith("linux"):
            return None, f"a warm parent needs Linux (/proc, pidfd_open); this is {sys.platform}"
        nodes, _ = self.topology.layout(job.world_size)
        if nodes > 1:
            return None, f"{nodes} nodes: each node's agent starts as a fresh interpreter"
        if job.python != sys.executable:
            return None, f"another Python environment ({job.python}) starts fresh interpreters"
        key = warm.ParentKey.of(job.python, job.rank_job.imports, env)
        try:
            parent, started_now = warm.parent_for(key)
        except warm.WarmUnavailable as exc:
            return None, str(exc)
        return WarmStart(parent, started_now), ""

    def run(self, job: WorkerJob) -> LaunchOutcome:
        token = uuid.uuid4().hex
        job.reports_dir.mkdir(parents=True, exist_ok=True)
        job.rank_job.write(job.spec_path)
        env = {**os.environ, **job.env, TOKEN_VAR: token}
        warm_start, note = self.warm_parent(job, env)  # before the clock: a first launch waits for its imports
        start = time.monotonic()
        marks = {"spawn": time.time()}  # the launch's timeline, the gate's part (LaunchOutcome.timeline)
        deadline = start + job.timeout_s
        procs: list[subprocess.Popen[bytes] | warm.WarmChild] = []
        timed_out = False
        try:
            for node, cmd in enumerate(self.commands(job, self.endpoint(), token)):
                log = job.workdir / f"agent{node}.log"
                node_env = {**env, **self.agent_env(job, node)}
                child = warm_start.fork(cmd, node_env, log) if warm_start else None
                if warm_start and child is None:
                    note, warm_start = warm_start.note, None
                procs.append(child or _popen(cmd, node_env, log))
            for proc in procs:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            marks["exit"] = time.time()
        except subprocess.TimeoutExpired:
            timed_out = True
            dump_worker_stacks(token, sessions=_sessions(procs))
        finally:
            # Always sweep: even a clean exit may leave a daemonised helper.
            for proc in procs:
                kill_tagged(token, proc.pid, sessions=_sessions(procs))
                proc.wait()
        outcome = classify(job, timed_out, time.monotonic() - start, marks)
        started: RankStart = "warm" if warm_start else "fork" if job.rank_start != "exec" else "exec"
        facts = warm_start.facts() if warm_start else {}
        return dataclasses.replace(outcome, started=started, start_note=note, warm=facts)


@dataclass
class WarmStart:
    """A launch's warm parent, and what went wrong with it, if anything."""

    parent: warm.WarmParent
    started_now: bool
    note: str = ""

    def fork(self, cmd: list[str], env: Mapping[str, str], log: Path) -> warm.WarmChild | None:
        """The agent ``cmd`` (``python -m AGENT ARGS``) forked by the parent; None, with the reason
        in ``note``, when the parent cannot (it is forgotten: the next launch starts another)."""
        try:
            return self.parent.fork(cmd[3:], env, log)
        except warm.WarmUnavailable as exc:
            self.note = str(exc)
            warm.forget(self.parent.key)
            return None

    def facts(self) -> dict[str, Any]:
        return self.parent.facts.as_json(self.started_now)


def _popen(cmd: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _sessions(procs: list[subprocess.Popen[bytes] | warm.WarmChild]) -> set[int]:
    """The sessions of the launch's warm agents: their forks show the parent's environment, not
    the launch's token (:func:`perfsuite.launch.procs.tagged_processes`)."""
    return {proc.pid for proc in procs if isinstance(proc, warm.WarmChild)}


class LocalTorchrun(TorchrunLauncher):
    """One torchrun agent with all ranks on this machine."""

    name = "local"
