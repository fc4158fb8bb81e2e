"""Process-tree cleanup for launched workers, and for the pytest runs a command starts.

torchrun starts every worker in a session of its own, so killing torchrun's
process group would leave the workers (and any GPU memory they hold) behind.
Each launch therefore tags its processes with a unique token in the environment
and cleanup kills every process that carries it, plus the launcher's known
descendants, even ones re-parented to init after their parent died.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from perfsuite.core.protocol import LAUNCHER_VAR

TOKEN_VAR = "PERFSUITE_RUN_TOKEN"
GRACE_S = 5.0
#: Seconds a command's child pytest gets between SIGTERM and SIGKILL: it stops its own agents
#: and ranks first (:data:`GRACE_S` each), and writes its results.
CHILD_GRACE_S = 15.0


def launcher_env() -> dict[str, str]:
    """``PERFSUITE_LAUNCHER`` naming this process, for the ranks' watchdog
    (:mod:`perfsuite.rank.worker.watchdog`): the create time tells a reused pid apart."""
    me = psutil.Process()
    return {LAUNCHER_VAR: f"{platform.node()}:{me.pid}:{me.create_time():.3f}"}


def tagged_processes(token: str, root_pid: int | None = None, sessions: Collection[int] = ()) -> list[psutil.Process]:
    """The launch's processes: ``root_pid`` and its descendants, every process whose environment
    carries ``token``, and every process in one of ``sessions``. An agent forked from a warm
    parent (:mod:`perfsuite.launch.warm`) and the ranks it forks show the parent's environment in
    ``/proc``, not the launch's token, so such a launch is swept by its agents' sessions too:
    a rank its agent left behind is re-parented, but stays in the agent's session."""
    found: dict[int, psutil.Process] = {}
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            for proc in [root, *root.children(recursive=True)]:
                found[proc.pid] = proc
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == os.getpid():
            continue
        try:
            if _in_session(proc.pid, sessions) or proc.environ().get(TOKEN_VAR) == token:
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return list(found.values())


def _in_session(pid: int, sessions: Collection[int]) -> bool:
    return bool(sessions) and os.getsid(pid) in sessions


def kill_tagged(
    token: str, root_pid: int | None = None, grace_s: float = GRACE_S, sessions: Collection[int] = ()
) -> int:
    """SIGTERM every tagged process (:func:`tagged_processes`), SIGKILL what is left after ``grace_s``.

    Returns how many processes had to be stopped.
    """
    procs = tagged_processes(token, root_pid, sessions)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    # A process forked between the scan and the kills would survive: scan again.
    late = tagged_processes(token, sessions=sessions)
    for proc in late:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    return len(procs) + len(late)


def _is_rank(proc: psutil.Process, tagged: set[int]) -> bool:
    """A rank started as a fresh interpreter was given RANK in its environment;
    one forked from its agent shows the agent's environment in /proc, so it is
    told by its parent instead: every tagged process but the agents has a tagged
    parent (an agent's parent is the launcher, or srun on a Slurm node)."""
    return "RANK" in proc.environ() or proc.ppid() in tagged


def dump_worker_stacks(token: str, settle_s: float = 2.0, sessions: Collection[int] = ()) -> None:
    """Ask every tagged rank (not the torchrun agent) to print its Python stacks.

    Workers register ``faulthandler`` for SIGUSR1; the agent is left alone,
    since SIGUSR1 would kill it before it can be swept cleanly.
    """
    tagged = tagged_processes(token, sessions=sessions)
    pids = {proc.pid for proc in tagged}
    sent = False
    for proc in tagged:
        try:
            if _is_rank(proc, pids):
                proc.send_signal(signal.SIGUSR1)
                sent = True
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    if sent:
        time.sleep(settle_s)  # faulthandler writes synchronously; leave time to flush


def interrupt_on_sigterm(prefix: str = "") -> Callable[[], None]:
    """Make SIGTERM (a cancelled CI job, Slurm's scancel) stop this process as Ctrl-C does, so
    its cleanup stops every child, agent and rank before it exits; by default SIGTERM ends the
    process at once and orphans them. ``prefix`` leads the KeyboardInterrupt's message. Left
    alone when someone else already handles SIGTERM, or off the main thread. Returns the
    finalizer that restores the default."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return lambda: None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"{prefix}{signal.Signals(signum).name} received, stopping")

    signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


#: The signals that stop a run: Ctrl-C and a cancelled job's SIGTERM.
STOPPING = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _handlers(new: Mapping[signal.Signals, Any]) -> Iterator[None]:
    """``new`` installed for the block, the old handlers back after it (only the main thread may set
    handlers: elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum, handler in new.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def signals_held() -> contextlib.AbstractContextManager[None]:
    """A second Ctrl-C or SIGTERM must not stop a cleanup half way and leave things behind.
    (Ignored, so a child started meanwhile, a ``git worktree remove``, ignores them too.)"""
    return _handlers(dict.fromkeys(STOPPING, signal.SIG_IGN))


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C or SIGTERM during the block is delivered after it, to the handler that was there
    before. Around a child's start: ``Popen`` forks, then waits for the exec, and an interrupt in
    between would leave a child that nobody stops. Recorded, not ignored: a child inherits an
    ignored signal, never a handler. A signal ignored before stays ignored."""
    came: list[int] = []

    def record(signum: int, frame: Any) -> None:
        came.append(signum)

    try:
        with _handlers({s: record for s in STOPPING if signal.getsignal(s) is not signal.SIG_IGN}):
            yield
    finally:
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


def stop_group(proc: subprocess.Popen[Any], grace_s: float = CHILD_GRACE_S) -> None:
    """SIGTERM ``proc``'s process group (it leads a session of its own), SIGKILL it after
    ``grace_s``; its output pipes are drained meanwhile, so a child blocked on a full pipe
    still exits."""
    with signals_held():
        for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the leader left behind in its group


@contextlib.contextmanager
def stoppable(argv: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """``argv`` started in a session of its own (``popen``: Popen's other arguments), and its whole
    group stopped (:func:`stop_group`) when the block is left by an exception: Ctrl-C, SIGTERM, or
    the caller's own. A signal during the start waits until the child exists (:func:`signals_deferred`)."""
    proc: subprocess.Popen[Any] | None = None
    try:
        with signals_deferred():
            proc = subprocess.Popen(list(argv), start_new_session=True, **popen)
        yield proc
    except BaseException:
        if proc is not None:
            stop_group(proc)
        raise


def run_stoppable(
    argv: Sequence[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` that stops the child's whole group
    when this process is interrupted (:func:`stoppable`): ``subprocess.run`` would SIGKILL the child
    alone, which then cannot stop what it started. Output bytes that are not UTF-8 are replaced."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "encoding": "utf-8", "errors": "replace"}
    with stoppable(argv, cwd=cwd, env=None if env is None else dict(env), **pipes) as proc:
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
