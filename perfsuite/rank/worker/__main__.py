"""Entry point of one rank: ``python -m perfsuite.rank.worker JOB.json`` (under torchrun),
or this file run in a rank forked from its agent (:mod:`perfsuite.rank.worker.agent`).

Reads the :class:`~perfsuite.core.protocol.RankJob`, runs its workload kind's
runner and writes ``rankN.json``: status ``ok`` with raw measurements, or
``oom`` / ``crash`` / ``skipped`` with the error, so the parent can classify
the run even when torchrun only reports an exit code.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import gc
import multiprocessing
import os
import platform
import signal
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from perfsuite.core.protocol import (
    RANK_PROCESS_PREFIX,
    EngineUnavailable,
    RankJob,
    RankReport,
    RankStatus,
    import_object,
)
from perfsuite.rank.worker import fresh, graph, watchdog
from perfsuite.rank.worker.base import Runner
from perfsuite.rank.worker.marks import mark, rank_started
from perfsuite.rank.worker.profiling import OomRecorder, is_oom
from perfsuite.rank.worker.quickexit import exit_now, exit_when_returned
from perfsuite.rank.worker.runtime import (
    Reporter,
    WorkerContext,
    lift_cpu_memory_budget,
    runtime_fingerprint,
)

STACK_DUMP_SIGNAL = signal.SIGUSR1
PR_SET_NAME = 15


def run(job: RankJob, runner: Runner, ctx: WorkerContext, reporter: Reporter) -> RankReport:
    runner.check(ctx)
    reporter.phase("init")
    ctx.init_process_group()
    reporter.mark("process_group")
    ctx.apply_limits(job)
    torch.manual_seed(job.seed)
    report = runner.run(ctx, reporter)
    reporter.phase("report")
    # Each node's first rank describes its node, so the fingerprint covers every node.
    runtime = runtime_fingerprint() if ctx.local_rank == 0 else {}
    return dataclasses.replace(report, host=platform.node(), forked=forked(), runtime=runtime)


def forked() -> bool:
    """Whether this rank is a fork of its torchrun agent (a multiprocessing child)."""
    return multiprocessing.parent_process() is not None


def as_fresh_interpreter() -> None:
    """Undo what a rank forked from its agent inherits but a new interpreter
    would not have: the agent's signal handlers (torchrun turns SIGTERM into an
    exception in the agent) and its OpenMP thread count, read when the agent
    imported torch, before torchrun set OMP_NUM_THREADS for the ranks (two ranks
    of two threads each on two cores measured 3x slower collectives)."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if threads := os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(threads))
    fresh.size_blas_pool(os.environ)


def name_process(name: str) -> None:
    """Set this process's name (Linux ``prctl(PR_SET_NAME)``, at most 15 bytes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    marks = rank_started()  # this rank's start, and its agent's marks
    argv = sys.argv[1:] if argv is None else argv
    name_process(f"{RANK_PROCESS_PREFIX}{os.environ.get('RANK', '')}")
    if forked():
        as_fresh_interpreter()
    graph.pin_inductor_cache()  # before any import of torch._dynamo
    # On timeout the launcher sends this signal to get every rank's Python stack
    # into its stderr before killing it: that is how a hung rank is told apart
    # from the ranks waiting for it in a collective.
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    watchdog.start()  # exit if the agent or the pytest process dies (SIGKILL leaves no one to stop us)
    job = RankJob.read(Path(argv[0]))
    runner: Runner = import_object(job.spec.runner)(job)  # before CUDA is touched
    fresh.preload(job.imports)  # before the memory budget, which covers the workload (a warm parent's are here)
    mark(marks, "rank_imports")
    ctx = WorkerContext.from_env(job.device)
    reporter = Reporter(Path(job.reports_dir), ctx.rank, marks)
    recorder = OomRecorder(ctx.device, Path(job.reports_dir), ctx.rank) if job.explain_oom else None
    try:
        if ctx.device.type == "cuda":
            ctx.open_device()
            reporter.mark("device")
        with recorder or contextlib.nullcontext():
            report, code = run(job, runner, ctx, reporter), 0
    except EngineUnavailable as exc:
        report, code = RankReport(rank=ctx.rank, status="skipped", error=str(exc)), 0
    except BaseException as exc:
        gc.collect()  # free the failed step's tensors before writing the report
        lift_cpu_memory_budget()
        traceback.print_exc()
        status: RankStatus = "oom" if is_oom(exc) else "crash"
        allocations = recorder.summary if recorder is not None else None
        report = RankReport(
            rank=ctx.rank, status=status, error=f"{type(exc).__name__}: {exc}"[:2000], op_profile=allocations
        )
        code = 1
    reporter.write(report)
    if code == 0:  # on failure the phase file keeps where the rank failed
        reporter.phase("done")
        if dist.is_initialized():
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    code = main()
    # A forked rank that succeeded returns, so that torchrun receives its return
    # value, and leaves right after; failures exit here.
    if code or not forked():
        exit_now(code)
    exit_when_returned()
