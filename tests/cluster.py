"""A real Slurm cluster (munge, slurmctld, slurmd) and network-namespace hosts
for the cluster tests, started from the Debian packages on this machine.

Safety (see CONTRIBUTING.md): every daemon is started here in the foreground and
stopped by its PID; namespace addresses are only ever used from inside the
namespaces, and their subnet is blackholed in the host namespace meanwhile, so
no test packet can leave the machine. Names carry the test process's PID, so
parallel runs do not clash and leftovers of a crashed run can be told apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from perfsuite.core.protocol import RANK_PROCESS_PREFIX
from perfsuite.launch.torchrun import free_ports

PREFIX = "pst"  # names of this module's namespaces: pst<pid>a, pst<pid>b
INSTALL = "as root: bash scripts/system-packages.sh"
#: Binary -> the Debian package that has it.
SLURM_BINARIES = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
}
NETNS_BINARIES = {"ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux"}


#: /proc/self/uid_map of a process in the machine's own user namespace.
HOST_UID_MAP = ["0", "0", "4294967295"]


def privilege_problem() -> str:
    """Why this process cannot start Slurm's daemons or make network namespaces ("" if it can)."""
    if os.geteuid() != 0:
        return "needs root: a Slurm cluster runs its daemons as root and network namespaces need CAP_NET_ADMIN"
    try:
        uid_map = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        uid_map = HOST_UID_MAP  # no user namespaces on this kernel: root is root
    if uid_map[:3] != HOST_UID_MAP:
        # Root of a container's user namespace (unshare -Ur, rootless containers): seen
        # failing here as slurmctld's "setgroups: Operation not permitted" and ip netns errors.
        return (
            f"root only inside a user namespace (uid_map {' '.join(uid_map)}): Slurm's daemons cannot drop "
            "supplementary groups and network namespaces need the host's CAP_NET_ADMIN"
        )
    return ""


def require(binaries: dict[str, str]) -> None:
    """Skip, naming what is missing and how to install it, unless real root with ``binaries``."""
    problem = privilege_problem()
    if problem:
        pytest.skip(problem)
    for binary, package in binaries.items():
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} not found: install the Debian package {package} ({INSTALL})")


def tails(logs: Sequence[Path]) -> str:
    return "\n".join(f"--- {p} ---\n{p.read_text(errors='replace')[-2000:]}" for p in logs if p.exists())


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float, logs: Sequence[Path] = ()) -> None:
    """Poll ``ready`` until true; fail after ``timeout_s`` showing the tails of ``logs``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout_s:.0f}s\n{tails(logs)}")
        time.sleep(0.2)


@dataclass
class Daemons:
    """Processes this fixture started, stopped by PID (SIGTERM, then SIGKILL)."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Newest first: the slurmds before slurmctld, munged last."""
        while self.procs:
            proc = self.procs.pop()
            stop_pid(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)  # reap it


def stop_pid(pid: int, grace_s: float = 5.0) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc = psutil.Process(pid)
        proc.terminate()
        _, alive = psutil.wait_procs([proc], timeout=grace_s)
        for left in alive:
            left.kill()
        psutil.wait_procs(alive, timeout=grace_s)


# -- network namespaces ------------------------------------------------------------


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_pids(name: str) -> list[int]:
    out = ip("netns", "pids", name, check=False)
    return [int(p) for p in out.stdout.split()]


def _delete_netns(name: str) -> None:
    # Only processes of our own namespaces, found by the namespace, by PID.
    for pid in netns_pids(name):
        stop_pid(pid, grace_s=2.0)
    ip("netns", "del", name, check=False)


def tag() -> str:
    """This test process's prefix for namespaces and cluster folders."""
    return f"{PREFIX}{os.getpid()}"


def clean_stale_daemons() -> None:
    """Stop, by PID, daemons a dead test process started: their command lines
    name its cluster folder, ``<basetemp>/pst<pid>-cluster<n>``."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] not in ("munged", "slurmctld", "slurmd"):
            continue
        m = re.search(rf"/{PREFIX}(\d+)-cluster\d*/", " ".join(proc.info["cmdline"] or []))
        if m and not psutil.pid_exists(int(m.group(1))):
            stop_pid(proc.pid)


def clean_stale_namespaces() -> None:
    """Delete namespaces this module made in a run that died (its PID is gone)."""
    for line in ip("netns", "list").stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)[ab])\b", line)
        if m and not psutil.pid_exists(int(m.group(2))):
            _delete_netns(m.group(1))


@dataclass
class Host:
    """One "machine": a network namespace with its own hostname and hosts file."""

    netns: str
    hostname: str
    addr: str
    veth: str
    hosts_file: Path

    def prefix(self) -> list[str]:
        """Run a command in this host's network namespace, as ``hostname``.

        Both namespaces share the machine's hostname, which resolves to
        127.0.0.1; a UTS namespace and a bind-mounted hosts file make each
        name resolve to its veth address, as on two real hosts. Not ``ip netns
        exec``: it remounts /sys, and slurmd then cannot start.
        """
        hosts, name = shlex.quote(str(self.hosts_file)), shlex.quote(self.hostname)
        script = f'mount --bind {hosts} /etc/hosts && hostname {name} && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--mount", "--uts", "sh", "-c", script, "sh"]

    def tx_bytes(self) -> int:
        """Bytes this host has sent over its end of the veth."""
        (link,) = json.loads(ip("-n", self.netns, "-s", "-j", "link", "show", self.veth).stdout)
        return int(link["stats64"]["tx"]["bytes"])


@contextlib.contextmanager
def two_hosts(workdir: Path) -> Iterator[tuple[Host, Host]]:
    """Two namespaces joined by a veth pair, each with one /24 address."""
    require(NETNS_BINARIES)
    clean_stale_namespaces()
    subnet = _claim_subnet()
    names = (f"{tag()}a", f"{tag()}b")
    hosts_file = workdir / "hosts"
    hosts = [
        Host(names[i], names[i], subnet.replace(".0/24", f".{i + 1}"), f"{tag()}v{i}", hosts_file) for i in range(2)
    ]
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{h.addr} {h.hostname}\n" for h in hosts))
    try:
        for host in hosts:
            add = ip("netns", "add", host.netns, check=False)
            if add.returncode:
                pytest.skip(f"this machine refuses network namespaces (ip netns add: {add.stderr.strip()})")
        ip("link", "add", hosts[0].veth, "type", "veth", "peer", "name", hosts[1].veth)
        for host in hosts:
            ip("link", "set", host.veth, "netns", host.netns)
            ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.veth)
            ip("-n", host.netns, "link", "set", host.veth, "up")
            ip("-n", host.netns, "link", "set", "lo", "up")
        yield hosts[0], hosts[1]
    finally:
        for host in hosts:  # deleting a namespace deletes its end of the veth, and so the pair
            _delete_netns(host.netns)
        ip("route", "del", "blackhole", subnet, check=False)


def _claim_subnet() -> str:
    """A 10.77.X.0/24 no other run uses, blackholed in the host namespace: from
    here on, a packet for it is dropped instead of following the default route."""
    for i in range(250):
        subnet = f"10.77.{(os.getpid() + i) % 250 + 1}.0/24"
        if ip("route", "add", "blackhole", subnet, check=False).returncode == 0:
            return subnet
    pytest.fail("no free 10.77.X.0/24 for the test namespaces (blackhole routes left by other runs?)")


# -- Slurm ---------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    addr: str
    prefix: tuple[str, ...] = ()  # how to run a command on it (its namespace)


@dataclass
class SlurmCluster:
    """munged, slurmctld on the first node and one slurmd per node."""

    root: Path
    nodes: Sequence[Node]
    daemons: Daemons = field(default_factory=Daemons)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def logs(self) -> list[Path]:
        return sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out"))

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def client(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command, run on the first node (where slurmctld listens)."""
        cmd = [*self.nodes[0].prefix, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False)

    @classmethod
    def folder(cls, factory: pytest.TempPathFactory) -> Path:
        """A scratch folder for a cluster, named so a later run can tell it was ours."""
        return factory.mktemp(f"{tag()}-cluster")

    def start(self) -> None:
        clean_stale_daemons()
        self._start_munge()
        self.conf.write_text(self._slurm_conf())
        first = self.nodes[0]
        self.daemons.start([*first.prefix, "slurmctld", "-D", "-i", "-f", str(self.conf)], self.root / "ctld.out")
        for node in self.nodes:
            cmd = [*node.prefix, "slurmd", "-D", "-N", node.name, "-f", str(self.conf)]
            self.daemons.start(cmd, self.root / f"slurmd-{node.name}.out")
        wait_for("every Slurm node idle", self._all_idle, 30, self.logs)

    def _all_idle(self) -> bool:
        for proc in self.daemons.procs:
            if proc.poll() is not None:
                pytest.fail(f"{proc.args!r} exited with {proc.returncode}\n{tails(self.logs)}")
        out = self.client("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return sorted(out[0::2]) == sorted(n.name for n in self.nodes) and set(out[1::2]) == {"idle"}

    def _start_munge(self) -> None:
        sock_dir = self.munge_socket.parent
        sock_dir.mkdir()
        sock_dir.chmod(0o755)  # munged refuses a socket directory others cannot enter
        key = self.root / "munge.key"
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True, timeout=30)
        argv = ["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}"]
        argv += [f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}"]
        argv += [f"--seed-file={self.root / 'munged.seed'}"]
        self.daemons.start(argv, self.root / "munged.out")
        wait_for("munged's socket", self.munge_socket.exists, 10, [self.root / "munged.log"])

    def _slurm_conf(self) -> str:
        r, first = self.root, self.nodes[0]
        cpus = os.cpu_count() or 1
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        lines = [
            f"ClusterName={tag()}",
            f"SlurmctldHost={first.name}({first.addr})",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            # No systemd, no cgroups: track processes through /proc.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "KillWait=2",
            "SlurmdParameters=config_overrides",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool-%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd-%n.log'}",
        ]
        for node, port in zip(self.nodes, node_ports, strict=True):
            lines.append(f"NodeName={node.name} NodeAddr={node.addr} Port={port} CPUs={cpus} State=UNKNOWN")
        lines.append("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        """Cancel what still runs (its steps end with it), then stop the daemons by PID."""
        if self.daemons.procs:
            self.client("scancel", "--full", "--quiet", "--partition=test", timeout_s=10)
            with contextlib.suppress(pytest.fail.Exception):
                wait_for("jobs gone", lambda: not self.client("squeue", "-h").stdout.strip(), 15)
        self.daemons.stop()


def submit(cluster: SlurmCluster, script: Path, *sbatch_args: str) -> str:
    out = cluster.client("sbatch", "--parsable", *sbatch_args, str(script))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def job_state(cluster: SlurmCluster, job_id: str) -> str:
    out = cluster.client("scontrol", "show", "job", job_id).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "UNKNOWN"


def wait_job_done(cluster: SlurmCluster, job_id: str, timeout_s: float) -> str:
    done = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    wait_for(f"job {job_id} finished", lambda: job_state(cluster, job_id) in done, timeout_s)
    return job_state(cluster, job_id)


def pytest_script(path: Path, workdir: Path, args: Sequence[str]) -> Path:
    """A batch script that runs pytest in ``workdir`` with ``args``."""
    cmd = " ".join(map(shlex.quote, [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]))
    path.write_text(f"#!/bin/bash\ncd {shlex.quote(str(workdir))}\nexec {cmd}\n")
    return path


def module_processes(marker: Path, module: str) -> list[psutil.Process]:
    """Live ``python -m module`` processes whose command line mentions ``marker``,
    ranks left out (conftest.rank_processes finds those).

    The interpreter's own ``-m`` counts, not a later one: a torchrun agent's
    command line ends in ``-m perfsuite.rank.worker`` too. A rank forked from its
    agent has the agent's command line, so ranks are told apart by name.
    """
    found = []
    for proc in psutil.process_iter(["cmdline", "name"]):
        argv = proc.info["cmdline"] or []
        runs = argv[argv.index("-m") + 1 : argv.index("-m") + 2] if "-m" in argv else []
        rank = (proc.info["name"] or "").startswith(RANK_PROCESS_PREFIX)
        if runs == [module] and not rank and any(str(marker) in a for a in argv):
            found.append(proc)
    return found
