"""Warm parents: the imports of a launch paid once per owner, fresh processes for every
measurement (pytest side, torch-free; the parent itself is :mod:`perfsuite.rank.worker.warmparent`).

A launch whose ranks start ``warm`` asks a warm parent to fork its torchrun agent instead of
starting an interpreter; the agent forks its ranks as with ``fork``. One parent serves every
launch of this process (the owner: a pytest session, an xdist worker of the self-tests) that
needs the same import set, Python and import-time environment (:class:`ParentKey`), so no rank
inherits the pages of a library it would not import. The parents live until this process
exits (:func:`stop_all`, at exit) and end by themselves within half a second when it dies.

Whatever keeps a launch from starting warm (no parent could start, the parent died or
refused to fork) is :class:`WarmUnavailable`, with the reason; the launcher then starts the
agent as a fresh interpreter and the results say so (``launch.rank_start``, ``launch.warm``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.core import procstat
from perfsuite.core.protocol import WARM_RLIMITS, pythonpath_entries
from perfsuite.launch.procs import TOKEN_VAR

PARENT_MODULE = "perfsuite.rank.worker.warmparent"
#: How long a parent may take to import its set: 2-4 s on the 2-core VM, with room for a cold
#: page cache, deepspeed and a busy machine.
START_TIMEOUT_S = 180.0
#: How long a parent may take to answer a request: it forks at once.
ANSWER_TIMEOUT_S = 30.0
#: Variables that torch, its engines, transformers or the interpreter read when they are
#: imported, and glibc's allocator settings, which it reads once when a process starts (a fork
#: keeps its parent's): a parent serves only requests whose values of these equal its own.
IMPORT_ENV_PREFIXES = (
    "MALLOC_",
    "GLIBC_TUNABLES",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS",
    "TRANSFORMERS",
    "HF_",
    "DS_",
    "DEEPSPEED",
    "CUDA",
    "NCCL",
    "LD_",
    "PYTHON",
    "XDG_CACHE_HOME",
    "TOKENIZERS",
)


class WarmUnavailable(RuntimeError):
    """A launch cannot start warm; the message says why."""


class ParentDied(WarmUnavailable):
    """The parent is gone: this launch starts without it, the next starts another."""


@dataclass(frozen=True)
class ParentKey:
    """What a warm parent's imports depend on: the interpreter, the import set, the import-time
    environment (:data:`IMPORT_ENV_PREFIXES`) and which installed packages the launch's own path
    shadows (:func:`shadowed`). The path itself is not part of it: two trees that shadow nothing
    (a team's repository at two revisions, ``ab-rev``'s sides) fork from one parent, each agent
    taking its own path (:func:`perfsuite.rank.worker.warmparent.become_agent`), so no state of a
    parent can favour one side."""

    python: str
    preload: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    perfsuite: str = ""
    """The perfsuite this process runs (ab-rev's two sides run two)."""
    shadows: tuple[tuple[str, str], ...] = ()
    pythonpath: str | None = dataclasses.field(default=None, compare=False)
    """The PYTHONPATH a parent starts with: the first requester's (its imports resolve alike for
    every request of the key)."""

    @classmethod
    def of(cls, python: str, preload: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> ParentKey:
        relevant = sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES) and k != "PYTHONPATH")
        imports = tuple(sorted(set(preload)))
        folder = os.getcwd() if cwd is None else cwd
        found = shadowed(imports, env.get("PYTHONPATH"), folder)
        return cls(python, imports, tuple(relevant), _this_perfsuite(), found, env.get("PYTHONPATH"))

    def digest(self) -> str:
        """A short name of this key, for a shared parent's folder."""
        named = {f.name: dataclasses.asdict(self)[f.name] for f in dataclasses.fields(self) if f.compare}
        return hashlib.sha256(json.dumps(named).encode()).hexdigest()[:16]


def shadowed(preload: Sequence[str], pythonpath: str | None, cwd: str) -> tuple[tuple[str, str], ...]:
    """The installed packages (and the import set's own) that the folders a launch puts ahead of
    the interpreter's path hold a copy of, each with the folder's entry: (name, path). A fresh
    interpreter would import those from there, so a parent that imported them elsewhere cannot
    serve it; a tree holding only its own modules (``perf_models``) shadows nothing."""
    names = _installed_names() | {module.split(".")[0] for module in preload}
    found: dict[str, str] = {}
    for entry in [cwd, *pythonpath_entries(pythonpath, cwd)]:
        with contextlib.suppress(OSError):
            for item in sorted(os.scandir(entry), key=lambda e: e.name):
                if item.is_dir():
                    name = item.name
                elif item.name.endswith((".py", ".so")):  # a module, or an extension (name.cpython-311-...so)
                    name = item.name.split(".")[0]
                else:
                    continue
                if name in names:
                    found.setdefault(name, item.path)
    return tuple(sorted(found.items()))


@functools.cache
def _installed_names() -> frozenset[str]:
    """The top-level import names of every installed distribution (read once a process)."""
    import importlib.metadata

    return frozenset(importlib.metadata.packages_distributions())


@dataclass(frozen=True)
class ParentFacts:
    """What a parent said when it was ready."""

    pid: int
    imports_s: float
    preloaded: tuple[str, ...]
    failed: Mapping[str, str]
    perfsuite: str
    ticks: str = ""
    """Its start in clock ticks after boot: a reused pid has another."""

    @classmethod
    def from_json(cls, ready: Mapping[str, Any]) -> ParentFacts:
        return cls(
            int(ready["pid"]),
            float(ready["imports_s"]),
            tuple(ready["preloaded"]),
            ready["failed"],
            ready["perfsuite"],
            str(ready.get("ticks", "")),
        )

    def as_json(self, started_now: bool) -> dict[str, Any]:
        """``launch.warm`` of a result: the parent, what it had imported, in how long, and
        whether this launch waited for that (the first launch of an import set does)."""
        return {
            "parent_pid": self.pid,
            "imports_s": self.imports_s,
            "preloaded": list(self.preloaded),
            "failed": dict(self.failed),
            "started_for_this_launch": started_now,
        }


class Lines:
    """JSON lines from a socket, each read within a timeout. (A socket's ``makefile`` refuses
    every read after one timed out; a launch waits again after its timeout, to reap.)"""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buffer = b""

    def read(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message; None at the end of the stream. TimeoutError past ``timeout``."""
        self.conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self.conn.recv(4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))


class WarmChild:
    """An agent a warm parent forked, waited for as ``subprocess.Popen`` is."""

    def __init__(self, pid: int, lines: Lines) -> None:
        self.pid = pid
        self._lines = lines
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The agent's exit status, from its parent; from the process table once the parent is
        gone (the agent then belongs to init, which reaps it)."""
        if self.returncode is not None:
            return self.returncode
        try:
            said = self._lines.read(timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(f"warm agent {self.pid}", timeout or 0.0) from None
        except OSError:  # the parent died mid-message
            said = None
        # Without an answer the parent died: the agent was re-parented.
        self.returncode = int(said["exit"]) if said else _wait_orphan(self.pid, timeout)
        self._lines.conn.close()
        return self.returncode


def _wait_orphan(pid: int, timeout: float | None) -> int:
    """Wait for an agent that is no child of ours to end: a zombie has ended (whoever reaps it,
    if anyone: a container's first process may not). Its status is lost with its parent: 0."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while procstat.runs(pid):
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(f"warm agent {pid}", timeout or 0.0)
        time.sleep(0.05)
    return 0


class WarmParent:
    """A running warm parent, started by this process or by another that shares its parents
    (:func:`share_with_children`); it lives in ``folder``: ``parent.sock``, ``parent.log``,
    ``ready.json``."""

    def __init__(self, key: ParentKey, folder: Path, facts: ParentFacts) -> None:
        self.key = key
        self.folder = folder
        self.facts = facts

    @property
    def socket_path(self) -> Path:
        return self.folder / "parent.sock"

    @classmethod
    def start(cls, key: ParentKey, folder: Path, owner: str) -> WarmParent:
        """Start a parent in ``folder``, watching ``owner``, and wait until it has imported its set
        (:data:`START_TIMEOUT_S`)."""
        hooks = _empty_site_hooks(folder / "hooks")
        cmd = [key.python, "-m", PARENT_MODULE, str(folder / "parent.sock"), "--owner", owner, "--hooks", str(hooks)]
        cmd += [arg for module in key.preload for arg in ("--preload", module)]
        env = {**os.environ, **dict(key.env), TOKEN_VAR: f"warm-{uuid.uuid4().hex}"}
        pythonpath = key.pythonpath if key.pythonpath is not None else env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hooks), pythonpath]))
        with open(folder / "parent.log", "wb") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        _STARTED.append(proc)  # kept, so that no Popen is collected (and warns) while its parent runs
        ready = _read_ready(proc, folder / "parent.log")
        parent = cls(key, folder, ParentFacts.from_json(ready))
        if ready.get("refusal"):
            parent.stop()
            raise WarmUnavailable(f"the warm parent would not fork: {ready['refusal']}")
        (folder / "ready.json").write_text(json.dumps(ready))
        return parent

    @classmethod
    def attach(cls, key: ParentKey, folder: Path) -> WarmParent | None:
        """The parent another process started in ``folder`` (alive or not), if one was ready there."""
        try:
            facts = ParentFacts.from_json(json.loads((folder / "ready.json").read_text()))
        except (OSError, ValueError, KeyError):
            return None
        return cls(key, folder, facts)

    def alive(self) -> bool:
        return procstat.runs(self.facts.pid, self.facts.ticks)

    def fork(self, args: Sequence[str], env: Mapping[str, str], log: Path) -> WarmChild:
        """A fresh agent, ``python -m perfsuite.rank.worker.agent ARGS`` as this process would have
        started it now (environment, working directory, CPU affinity, resource limits), with its
        output in ``log``."""
        request = {
            "args": list(args),
            "env": dict(env),
            "cwd": os.getcwd(),
            "log": str(log),
            "affinity": sorted(os.sched_getaffinity(0)),
            "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in WARM_RLIMITS},
            "umask": _umask(),
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lines = Lines(conn)
        try:
            conn.settimeout(ANSWER_TIMEOUT_S)
            conn.connect(str(self.socket_path))
            conn.sendall((json.dumps(request) + "\n").encode())
            answer = lines.read(ANSWER_TIMEOUT_S) or {"refused": "it closed the connection"}
        except (OSError, ValueError) as exc:
            conn.close()
            raise WarmUnavailable(f"the warm parent (pid {self.facts.pid}) did not answer: {exc}") from None
        if "pid" not in answer:
            conn.close()
            raise WarmUnavailable(f"the warm parent (pid {self.facts.pid}) did not fork: {answer.get('refused')}")
        return WarmChild(int(answer["pid"]), lines)

    def stop(self) -> None:
        """End the parent (its agents, if any, are swept by their launches) and remove its folder."""
        if self.alive():
            _end(self.facts.pid)
        shutil.rmtree(self.folder, ignore_errors=True)


def _empty_site_hooks(folder: Path) -> Path:
    """A folder of empty ``sitecustomize`` and ``usercustomize`` modules, first on the parent's path:
    the interpreter's start imports them instead of the real hooks, which each forked agent runs
    once, with its launch's environment (a hook that patches would otherwise patch twice)."""
    folder.mkdir()
    for name in ("sitecustomize", "usercustomize"):
        (folder / f"{name}.py").write_text("")
    return folder


def _end(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM ``pid``, SIGKILL it if it still runs after ``grace_s``; reap it if it is ours."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            _reap()
            if not procstat.runs(pid):
                return
            time.sleep(0.02)


def _reap() -> None:
    for proc in _STARTED:
        proc.poll()


def _read_ready(proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """The parent's ready line, or WarmUnavailable with why it never came."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    if line:
        said = json.loads(line)
        return {**said["ready"], "refusal": said.get("refusal")}
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
    why = f"it exited with status {proc.returncode}" if ready else f"not ready within {START_TIMEOUT_S:.0f} s"
    raise WarmUnavailable(f"the warm parent did not start ({why}):\n{tail}")


def _owner(pid: int | None = None) -> str:
    """``PID:START_TICKS`` of a process (this one), which a parent watches (a reused pid has another start)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{procstat.start_ticks(pid)}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Popen objects of the parents this process started.
_STARTED: list[subprocess.Popen[bytes]] = []
#: This process's own parents (not shared), by key.
_PARENTS: dict[ParentKey, WarmParent] = {}
#: Keys whose parent could not serve this process, and why: asked once, not at every launch.
_REFUSED: dict[ParentKey, str] = {}
#: A folder of shared parents, whose owner (first line of its ``owner`` file) stops them.
SHARED_VAR = "PERFSUITE_WARM_PARENTS"


def parent_for(key: ParentKey) -> tuple[WarmParent, bool]:
    """The parent for ``key``, started if there is none: (parent, started now). Shared through
    :data:`SHARED_VAR`'s folder when it is set, else this process's own. WarmUnavailable when a
    parent for ``key`` cannot serve this process (said once, then at every launch without trying
    again), or died (the next launch starts another)."""
    if key in _REFUSED:
        raise WarmUnavailable(_REFUSED[key])
    shared = os.environ.get(SHARED_VAR)
    try:
        found = _shared(key, Path(shared)) if shared else _own(key)
    except ParentDied:
        raise
    except WarmUnavailable as exc:
        _REFUSED[key] = str(exc)
        raise
    except OSError as exc:  # the shared folder went with its owner, a full disk...
        _REFUSED[key] = f"no warm parent could be started: {exc}"
        raise WarmUnavailable(_REFUSED[key]) from None
    parent, started_now = found
    mine = _this_perfsuite()
    if str(Path(parent.facts.perfsuite).resolve()) != mine:
        _REFUSED[key] = f"the warm parent imported perfsuite from {parent.facts.perfsuite}, this run's is {mine}"
        raise WarmUnavailable(_REFUSED[key])
    return parent, started_now


def _this_perfsuite() -> str:
    return str(Path(sys.modules["perfsuite"].__file__ or "").resolve())


def _own(key: ParentKey) -> tuple[WarmParent, bool]:
    parent = _PARENTS.get(key)
    if parent is not None and not parent.alive():
        forget(key)
        raise ParentDied(f"the warm parent (pid {parent.facts.pid}) died; the next launch starts another")
    if parent is not None:
        return parent, False
    parent = WarmParent.start(key, Path(tempfile.mkdtemp(prefix="perfsuite-warm-")), _owner())
    _PARENTS[key] = parent
    return parent, True


def _shared(key: ParentKey, root: Path) -> tuple[WarmParent, bool]:
    """The parent for ``key`` in the shared folder ``root``, started (owned by the folder's owner)
    if none runs there; one process at a time looks, under a file lock."""
    from filelock import FileLock

    folder = root / key.digest()
    with FileLock(str(folder) + ".lock"):
        parent = WarmParent.attach(key, folder)
        if parent is not None and parent.alive():
            return parent, False
        shutil.rmtree(folder, ignore_errors=True)
        if parent is not None:
            raise ParentDied(f"the warm parent (pid {parent.facts.pid}) died; the next launch starts another")
        folder.mkdir(parents=True)
        owner = (root / "owner").read_text().strip()
        return WarmParent.start(key, folder, owner), True


def forget(key: ParentKey) -> None:
    """Drop (and stop) the parent of ``key``, so the next launch starts a new one."""
    parent = _PARENTS.pop(key, None)
    if parent is None and os.environ.get(SHARED_VAR):
        parent = WarmParent.attach(key, Path(os.environ[SHARED_VAR]) / key.digest())
    if parent is not None:
        parent.stop()


def share_with_children() -> Path:
    """Make this process the owner of a folder of warm parents that the processes it starts use
    too (:data:`SHARED_VAR`, set in its environment): the self-tests' pytest sessions of one
    xdist worker, ``ab-rev``'s and ``bootstrap``'s. The parents end when this process exits
    (at exit, or within half a second of its death)."""
    if os.environ.get(SHARED_VAR) and _owns(Path(os.environ[SHARED_VAR])):
        return Path(os.environ[SHARED_VAR])
    root = Path(tempfile.mkdtemp(prefix="perfsuite-warm-parents-"))
    (root / "owner").write_text(_owner() + "\n")
    os.environ[SHARED_VAR] = str(root)
    _SHARED_ROOTS.append(root)
    return root


def _owns(root: Path) -> bool:
    try:
        return (root / "owner").read_text().strip() == _owner()
    except OSError:
        return False


_SHARED_ROOTS: list[Path] = []


@atexit.register
def stop_all() -> None:
    """Stop every parent this process owns: its own, and those of the folders it shares."""
    while _PARENTS:
        _, parent = _PARENTS.popitem()
        parent.stop()
    for root in _SHARED_ROOTS:
        for ready in root.glob("*/ready.json"):
            attached = WarmParent.attach(ParentKey("", (), ()), ready.parent)
            if attached is not None and attached.alive():
                attached.stop()
        shutil.rmtree(root, ignore_errors=True)
    _SHARED_ROOTS.clear()
