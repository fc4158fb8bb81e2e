"""Slurm: inside an allocation, one torchrun agent per node started by ``srun``.

The rendezvous endpoint is the allocation's first node. The job folder (spec,
reports, logs) must be on a filesystem every node sees, e.g. set
``--basetemp`` to a shared path. ``srun --kill-on-bad-exit`` ends every node's
agent when one fails; killing srun on timeout makes Slurm signal the remote
steps, so no rank outlives the run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping

from perfsuite.launch.base import WorkerJob
from perfsuite.launch.torchrun import Topology, TopologyError, TorchrunLauncher

#: The rendezvous port is 15000 + the job ID's last four digits (as PyTorch
#: Lightning's Slurm environment picks it), below Linux's ephemeral range
#: (32768+), so that two jobs sharing a node do not meet on one port.
#: ``MASTER_PORT`` in the job's environment overrides it.
RDZV_PORT_BASE = 15000


def rdzv_port(env: Mapping[str, str]) -> int:
    """The c10d port every node of the job derives alike, with no exchange."""
    if env.get("MASTER_PORT"):
        port = env["MASTER_PORT"]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise TopologyError(f"MASTER_PORT={port!r} is not a TCP port (1-65535): unset it or give a number")
        return int(port)
    return RDZV_PORT_BASE + int(env["SLURM_JOB_ID"]) % 10_000


def first_host(nodelist: str, expand: Callable[[str], list[str]] | None = None) -> str:
    """First hostname of a Slurm nodelist (``node[01-04]`` -> ``node01``)."""
    hosts = (expand or _scontrol_hostnames)(nodelist)
    if not hosts:
        raise TopologyError(f"empty Slurm nodelist {nodelist!r}")
    return hosts[0]


def _scontrol_hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def topology_from_env(
    env: Mapping[str, str], nproc_per_node: int | None = None, expand: Callable[[str], list[str]] | None = None
) -> Topology:
    """Nodes, ranks per node and endpoint from the allocation's environment."""
    if "SLURM_JOB_ID" not in env:
        raise TopologyError("--perf-launcher=slurm must run inside a Slurm allocation (SLURM_JOB_ID is unset)")
    nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES", "1"))
    per_node = nproc_per_node or int(env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_NTASKS_PER_NODE") or 1)
    host = first_host(env["SLURM_JOB_NODELIST"], expand)
    return Topology(
        nnodes=nnodes, nproc_per_node=per_node, rdzv_endpoint=f"{host}:{rdzv_port(env)}", local_agents=1, flexible=True
    )


class SlurmLauncher(TorchrunLauncher):
    name = "slurm"
    agents_here = False  # srun starts each node's agent

    @classmethod
    def from_env(cls, nproc_per_node: int | None = None) -> SlurmLauncher:
        return cls(topology_from_env(os.environ, nproc_per_node))

    def commands(self, job: WorkerJob, endpoint: str, run_id: str) -> list[list[str]]:
        # One srun step, one task per node; each task is that node's agent. Its
        # log dir must expand $SLURM_NODEID on the node, so that one argument is
        # double-quoted for the task's shell and every other one shell-quoted.
        agent = self.agent_command(job, endpoint, run_id, node=0)
        log_dir = agent.index("--log-dir") + 1
        node_log_dir = f'"{job.logs_dir / "node"}$SLURM_NODEID"'
        inner = " ".join(node_log_dir if i == log_dir else shlex.quote(a) for i, a in enumerate(agent))
        return [
            [
                "srun",
                f"--nodes={self.topology.layout(job.world_size)[0]}",
                "--ntasks-per-node=1",
                "--kill-on-bad-exit=1",
                "--export=ALL",
                "bash",
                "-c",
                inner,
            ]
        ]

    def agent_env(self, job: WorkerJob, node: int) -> dict[str, str]:
        # srun reads the allocation's SLURM_NTASKS (set by, say, sbatch
        # --ntasks-per-node=8) as its task count, ignores --ntasks-per-node=1
        # and would start that many agents per node: one task per node instead.
        return {**super().agent_env(job, node), "SLURM_NTASKS": str(self.topology.layout(job.world_size)[0])}

    def endpoint(self) -> str:
        assert self.topology.rdzv_endpoint is not None  # from_env always sets it
        return self.topology.rdzv_endpoint
