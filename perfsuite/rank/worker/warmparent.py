"""``python -m perfsuite.rank.worker.warmparent SOCKET --owner PID:CREATED [--preload MODULE ...]``:
a warm parent ("zygote") that pays a launch's imports once and forks a fresh torchrun agent
for every launch (launched side; the gate's client is :mod:`perfsuite.launch.warm`).

It imports torch, ``torch._dynamo``, torchrun and perfsuite's rank worker, then the modules of
its import set (``--preload``: transformers' model classes, deepspeed, ...), writes one JSON
line to stdout (``ready``: its pid, what it imported and how long that took) and serves
requests on a Unix socket, one connection per agent. A request is one JSON line with the
agent's arguments, environment, working directory, log file, CPU affinity and resource limits;
the parent forks, the child becomes the agent exactly as ``python -m perfsuite.rank.worker.agent``
would (:func:`become_agent`), and the parent answers ``{"pid": N}``, then ``{"exit": CODE}``
when the agent has ended. The agent forks its ranks as a fresh one does, so every measurement still
runs in new processes: a new allocator, CUDA context and process group, and a crash or an
OOM kills only forks.

Forking is refused, with the reason (the gate then starts the agent as a fresh
interpreter), while this process has initialised CUDA or runs a second thread: a fork
would inherit a CUDA context it cannot use, or a lock some thread held. So the parent
sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` before anything asks ``torch.cuda``, and touches
no device.

It exits when its owner (the process named by ``--owner``, the gate) is gone, within
:data:`POLL_S`, and when its socket is closed by :func:`stop` (SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import resource
import selectors
import shlex
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import setproctitle

from perfsuite.core import procstat
from perfsuite.core.protocol import pythonpath_entries
from perfsuite.rank.worker import fresh

#: The parent's process name.
PARENT_NAME = "perfsuite-warm"
#: How often the parent looks for its owner while idle (seconds).
POLL_S = 0.5


def threads() -> int:
    """Threads of this process, as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


def fork_refusal() -> str | None:
    """Why this process must not fork an agent now, or None when it may."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the warm parent has initialised CUDA, which a forked agent could not use"
    if torch is not None and torch.cuda._is_compiled() and cuda_poisons_forks():
        return "the warm parent asked the CUDA driver something, so its forks cannot use CUDA"
    count = threads()
    if count != 1:
        return f"the warm parent runs {count} threads; a fork would copy locks they may hold"
    return None


def cuda_poisons_forks() -> bool:
    """Whether a child forked now would find CUDA unusable: torch marks its forks bad once it has
    asked the driver anything (``poison_fork``), which ``is_initialized`` does not say. A child
    that only reads the mark tells."""
    pid = os.fork()
    if pid == 0:
        os._exit(int(sys.modules["torch"].cuda._is_in_bad_fork()))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def owner_alive(owner: str) -> bool:
    """Whether the process ``PID:START_TICKS`` still runs."""
    pid, _, ticks = owner.partition(":")
    return procstat.runs(pid, ticks)


def warm_up(modules: list[str]) -> dict[str, Any]:
    """Everything a launch would import, once; what was imported and in how long."""
    started = time.time()
    from perfsuite.rank.worker.agent import NVML_CHECK

    os.environ.update(NVML_CHECK)  # before torchrun or an engine asks torch.cuda
    # numpy's OpenBLAS (torch imports numpy) starts its thread pool when it loads, and a fork
    # carries no threads; the forked agent sets the count a fresh interpreter would have.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    from perfsuite.rank.worker import graph  # imports torch

    graph.pin_inductor_cache()  # as a rank does, before an import of torch._dynamo reads the variable
    import torch.distributed.run  # noqa: F401 - the agent's torchrun

    import perfsuite.rank.worker.__main__  # noqa: F401 - the rank's entry and its imports

    done, failed = fresh.preload(modules)
    return {"imports_s": round(time.time() - started, 3), "preloaded": done, "failed": failed}


@dataclass
class Agent:
    """One forked agent and the connection that asked for it."""

    pid: int
    pidfd: int
    conn: socket.socket


@dataclass
class Server:
    listener: socket.socket
    owner: str
    base_path: list[str]
    """The interpreter's import path less its first entry, as it was before any import."""
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    agents: dict[int, Agent] = field(default_factory=dict)  # pidfd -> agent

    def serve(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        while owner_alive(self.owner):
            for key, _ in self.selector.select(POLL_S):
                if key.data == "listener":
                    self.accept()
                else:
                    self.reap(key.data)

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        conn.settimeout(10.0)
        try:
            request = json.loads(conn.makefile("r").readline())
        except (OSError, ValueError) as exc:
            _send(conn, {"refused": f"unreadable request: {exc}"})
            conn.close()
            return
        refusal = fork_refusal()
        if refusal is not None:
            _send(conn, {"refused": refusal})
            conn.close()
            return
        self.fork(conn, request)

    def fork(self, conn: socket.socket, request: Mapping[str, Any]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the agent: never returns
            try:
                become_agent(request, self.owned_fds(conn), self.base_path)
            except BaseException:  # whatever it is, the child must not go on serving
                traceback.print_exc()
                os._exit(70)
        pidfd = os.pidfd_open(pid)
        self.agents[pidfd] = Agent(pid, pidfd, conn)
        self.selector.register(pidfd, selectors.EVENT_READ, pidfd)
        _send(conn, {"pid": pid})

    def owned_fds(self, conn: socket.socket) -> list[int]:
        """The descriptors of this server that a forked agent must close."""
        fds = [self.listener.fileno(), conn.fileno(), self.selector.fileno()]  # type: ignore[attr-defined]
        for agent in self.agents.values():
            fds += [agent.pidfd, agent.conn.fileno()]
        return fds

    def reap(self, pidfd: int) -> None:
        agent = self.agents.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(agent.pid, 0)
        with contextlib.suppress(OSError):  # the gate may have given up on it
            _send(agent.conn, {"exit": os.waitstatus_to_exitcode(status)})
        agent.conn.close()


def _send(conn: socket.socket, message: Mapping[str, Any]) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def become_agent(request: Mapping[str, Any], inherited: list[int], base_path: list[str]) -> None:
    """In the forked child: take the process state an exec'd agent would have had from its
    spawner (session, standard streams, environment, working directory, import path, CPU
    affinity, resource limits), then run the agent's ``main``, which exits."""
    os.setsid()  # as Popen(start_new_session=True): Ctrl-C and the gate's group signals miss it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # this parent's own handler, not an interpreter's
    for fd in inherited:
        os.close(fd)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # As `python -m` in that folder with that PYTHONPATH: the folder, PYTHONPATH's entries, then the
    # interpreter's own (a parent serves launches of other trees whose path shadows nothing it imported).
    own = pythonpath_entries(request["env"].get("PYTHONPATH"), request["cwd"])
    sys.path[:] = [request["cwd"], *dict.fromkeys([*own, *base_path])]
    importlib.invalidate_caches()
    os.sched_setaffinity(0, request["affinity"])
    for name, (soft, hard) in request["rlimits"].items():  # perfsuite.core.protocol.WARM_RLIMITS
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.umask(request["umask"])
    fresh.size_blas_pool(request["env"])
    fresh.run_site_hooks()
    from perfsuite.rank.worker import agent

    sys.argv = [agent.__file__, *request["args"]]
    # ps, and a person looking for a launch's processes, see the agent an exec would have started.
    setproctitle.setproctitle(shlex.join([sys.executable, "-m", agent.__name__, *request["args"]]))
    set_comm(os.path.basename(sys.executable))  # the parent's name, inherited, is not the agent's
    agent.main()


def set_comm(name: str) -> None:
    """This process's name (``/proc/self/comm``, at most 15 bytes), as ``ps`` and psutil show it."""
    with open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


def stop(signum: int, frame: object) -> None:
    """SIGTERM: leave at once; the agents are in sessions of their own and their ranks watch the gate."""
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perfsuite.rank.worker.warmparent")
    parser.add_argument("socket")
    parser.add_argument("--owner", required=True, help="PID:START_TICKS of the gate that owns this parent")
    parser.add_argument("--preload", action="append", default=[], help="a module to import (repeatable)")
    parser.add_argument("--hooks", help="the folder of empty site hooks the interpreter's start imported")
    args = parser.parse_args(argv)
    setproctitle.getproctitle()  # finds argv's memory now: after the environment changes it cannot
    set_comm(PARENT_NAME)  # which that set to the command line's start
    # The interpreter's own import path, before any import adds to it: less the working directory
    # and PYTHONPATH's entries (each agent puts its launch's own first), among them the folder whose
    # empty site hooks stood in for the real ones (each agent runs those, fresh.py).
    leading = set(pythonpath_entries(os.environ.get("PYTHONPATH"), os.getcwd()))
    base_path = [entry for entry in sys.path[1:] if entry not in leading]
    for hook in ("sitecustomize", "usercustomize"):
        sys.modules.pop(hook, None)
    signal.signal(signal.SIGTERM, stop)
    # Standard output is the gate's, for the ready line only: what the imports print (DeepSpeed
    # logs its accelerator there) goes to standard error, the parent's log.
    said = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    facts = warm_up(args.preload)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(16)
    perfsuite = sys.modules["perfsuite"].__file__  # which checkout it imported
    ready = {"pid": os.getpid(), "ticks": procstat.start_ticks(), "perfsuite": perfsuite, **facts}
    with said:
        said.write(json.dumps({"ready": ready, "refusal": fork_refusal()}) + "\n")
    Server(listener, args.owner, base_path).serve()
    os._exit(0)


if __name__ == "__main__":
    main()
