"""The measured loop every workload kind runs: warm up until step times settle,
then time the measured steps with memory and health sampled at each."""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from perfsuite.core.opprofile import PLANTED_REGION, OpProfile
from perfsuite.core.protocol import RankJob, RankReport
from perfsuite.core.workcount import WorkCount
from perfsuite.rank.worker.health import HealthTracker
from perfsuite.rank.worker.memory import MemoryTracker
from perfsuite.rank.worker.runtime import Reporter, WorkerContext, lift_cpu_memory_budget

STEADY_WINDOW = 3  # trailing warmup steps whose spread decides "settled"
PROFILED_LAUNCH_STEPS = 3  # measured steps of a launch that profiles (their median is its reference)

#: One step of the workload; ``last`` is True on the final measured step.
Step = Callable[[bool], None]


@dataclass(frozen=True)
class LoopResult:
    step_times_s: list[float]
    warmup_times_s: list[float]
    steady_state_start: int
    peak_mem_mib: float
    memory: dict[str, Any] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)
    reference_times_s: list[float] = field(default_factory=list)
    op_profile: OpProfile | None = None
    work_count: WorkCount | None = None

    def report(self, rank: int, **fields: Any) -> RankReport:
        """This rank's ``ok`` report of the loop; a kind adds its own ``fields``
        (its ``rank`` metrics, losses, model state)."""
        return RankReport(
            rank=rank,
            status="ok",
            step_times_s=tuple(self.step_times_s),
            warmup_times_s=tuple(self.warmup_times_s),
            steady_state_start=self.steady_state_start,
            reference_times_s=tuple(self.reference_times_s),
            memory=self.memory,
            health=self.health,
            op_profile=self.op_profile,
            work_count=self.work_count,
            **fields,
        )


def slowest_rank(seconds: float, ctx: WorkerContext) -> float:
    """Step time of the slowest rank, the same number on every rank, so all
    ranks agree on when warmup ends (unequal step counts would deadlock)."""
    value = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def settled(times: Sequence[float], threshold: float) -> bool:
    """The trailing window's spread (max - min) / median is within ``threshold``."""
    if len(times) < STEADY_WINDOW:
        return False
    window = times[-STEADY_WINDOW:]
    return (max(window) - min(window)) / statistics.median(window) <= threshold


def burn(seconds: float, ctx: WorkerContext) -> None:
    """Real device work for about ``seconds`` (the planted slowdown): matmuls
    on the device, synchronised, so it is as visible to the timer as slower
    kernels would be."""
    # Its own profiler region: an op profile shows it as perfsuite's, not as slower model ops.
    with torch.profiler.record_function(PLANTED_REGION):
        a = torch.randn(256, 256, device=ctx.device)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            a = torch.tanh(a @ a)
            ctx.synchronize()


class Reference:
    """A fixed amount of CPU work (SHA-256 of ``mib`` MiB, one core), timed.

    Run by every rank right after each measured step, outside the step's
    timer. Its time says how fast this machine runs *right now*: on a busy or
    slower-clocked host it grows with the steps, so steps per reference time
    cancels the machine's drift, while a slower stack leaves it alone. It is
    hashlib (OpenSSL), not torch, so a torch upgrade cannot move the yardstick
    along with what it measures.
    """

    def __init__(self, mib: int) -> None:
        self.data = bytes(range(256)) * (mib * 4096)  # fixed content: the same work every run
        self.times: list[float] = []

    def __call__(self) -> None:
        start = time.perf_counter()
        hashlib.sha256(self.data).digest()
        self.times.append(time.perf_counter() - start)


class StepTimer:
    """Times one step from synchronised clocks, planted work included."""

    def __init__(self, step: Step, ctx: WorkerContext) -> None:
        self.step, self.ctx = step, ctx
        self.burn_s = 0.0  # planted extra work per step, set once warmup knows a step's cost

    def __call__(self, last: bool = False) -> float:
        self.ctx.synchronize()
        start = time.perf_counter()
        self.step(last)
        self.ctx.synchronize()
        if self.burn_s:
            burn(self.burn_s, self.ctx)
        return time.perf_counter() - start


def measure(step: Step, job: RankJob, ctx: WorkerContext, reporter: Reporter) -> LoopResult:
    """Warm up until step times settle, then time ``job.spec.steps`` steps.

    Warmup runs at least ``warmup_steps`` and at most ``max_warmup_steps``
    steps; it ends early once the trailing window's spread is within
    ``job.steady_threshold``.

    A planted slowdown (``slowdown_pct``) adds a fixed amount of device work
    to every step after the first warmup steps: that percentage of their
    median (slowest-rank) time, the first step left out. A fixed amount,
    because burning a share of each step's own time would feed back through
    the ranks' waits on each other.
    """
    spec, timer = job.spec, StepTimer(step, ctx)
    slowdown = job.slowdown_pct / 100
    warmup: list[float] = []
    settle_from = 0  # steady state is judged on steps with the final per-step work
    while len(warmup) < spec.max_warmup_steps:
        if len(warmup) >= spec.warmup_steps and settled(warmup[settle_from:], job.steady_threshold):
            break
        reporter.phase(f"warmup step {len(warmup)}")
        warmup.append(slowest_rank(timer(), ctx))
        if slowdown and not timer.burn_s and len(warmup) >= max(2, spec.warmup_steps):
            # Not the first step: it pays for first-touch allocations and kernel choices, up to
            # twice a settled step on cpu, and would plant that much more (docs/lab/contention.md).
            timer.burn_s = slowdown * statistics.median(warmup[1:])
            settle_from = len(warmup)
    if slowdown and not timer.burn_s:  # no warmup allowed: one reference step
        timer.burn_s = slowdown * slowest_rank(timer(), ctx)
    reporter.mark("warmup")
    times: list[float] = []
    reference = Reference(job.reference_mib) if job.reference_mib else None
    # A launch that profiles needs only the unprofiled step time of its own from these steps.
    steps = min(spec.steps, PROFILED_LAUNCH_STEPS) if job.profile_steps else spec.steps
    with MemoryTracker.for_device(ctx.device) as memory, HealthTracker.for_device(ctx.device) as health:
        for i in range(steps):
            reporter.phase(f"measure step {i + 1}/{steps}")
            times.append(timer(last=i == steps - 1))
            if reference is not None:
                reference()
            memory.sample()
            health.sample()
    reporter.mark("measure")
    profiled = _profiled(timer, job, ctx, statistics.median(times)) if job.profile_steps else None
    return LoopResult(
        times,
        warmup,
        len(warmup),
        memory.result.peak_mem_mib,
        memory.result.detail,
        health.result,
        reference.times if reference is not None else [],
        profiled,
        _counted(timer, ctx, reporter) if job.count_work and not job.profile_steps else None,
    )


def _counted(timer: StepTimer, ctx: WorkerContext, reporter: Reporter) -> WorkCount:
    """What a step does, counted in a few more steps after the measured ones (untimed)."""
    from perfsuite.rank.worker.workcount import count_steps  # torch.profiler: only in launches that count

    reporter.phase("counting a step's work")
    if ctx.device.type == "cpu":
        # The budget bounds the measured steps, which are done; the profiler's records would count
        # against it, and one rank out of memory here would leave the others in a collective.
        lift_cpu_memory_budget()
    return count_steps(timer, ctx.device)


def _profiled(timer: StepTimer, job: RankJob, ctx: WorkerContext, unprofiled_s: float) -> OpProfile:
    """``job.profile_steps`` more steps under the profiler, after the measured ones."""
    from perfsuite.rank.worker.profiling import run_profiled  # torch.profiler: only in launches that profile

    wanted = job.profile_trace and ctx.rank == 0
    trace = Path(job.reports_dir) / f"trace-rank{ctx.rank}.json" if wanted else None  # not rank*.json: a report's
    return run_profiled(timer, job.profile_steps, ctx.device, unprofiled_s, trace)
