"""Machine health during measurement: is the hardware running as it should?

On CUDA, NVML is sampled once per measured step: SM clock, power draw,
temperature and the clock-event (throttle) reasons, which say *why* clocks
dropped (power cap, thermal, hardware slowdown); the energy counter is read
before and after the measured steps. On CPU, load average and
current frequency are sampled: another busy process shows up as load above
this run's ranks. Nothing here changes any setting.

Contention is accounted on every device: over the measured steps each rank
reads the host's busy and steal CPU time (``/proc/stat`` through psutil) and
its own process's CPU time; the pytest side subtracts the ranks' own time
from the host's to get what other processes took. On CUDA, NVML's per-process
utilisation samples name other processes computing on this rank's GPU.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import psutil
import torch

from perfsuite.core.nvmlcodes import HARMLESS_REASONS, reasons_of
from perfsuite.rank.worker.nvml import NvmlDevice


class HealthTracker:
    """Context manager; ``sample()`` per step; ``result`` afterwards."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.samples: list[dict[str, float]] = []
        self.reasons: set[str] = set()
        self.result: dict[str, Any] = {}

    def __enter__(self) -> HealthTracker:
        self.ranks, self.launch = _run_processes()
        self.procs_start = cpu_by_process()
        self.launch_start = _precise_cpu_s(self.launch)
        self.start_s = time.perf_counter()
        self.host_start = psutil.cpu_times()
        self.own_start = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = self.finish()

    def contention(self) -> dict[str, Any]:
        """CPU seconds over the measured steps: the host's busy and steal time, this rank's own
        (threads included) and the launch's other processes' (its agent and the processes above
        it), for the pytest side to subtract; and the other processes that used the most.

        The host's counters (``/proc/stat``) come in clock ticks (``tick_s``); this process's
        and the launch's are read in nanoseconds, so that only the host's two readings limit
        how finely a short window can be told apart from a busy one."""
        own, host = time.process_time() - self.own_start, psutil.cpu_times()
        window = time.perf_counter() - self.start_s
        launch = _precise_cpu_s(self.launch) - self.launch_start
        used = {
            pid: (name, cpu - self.procs_start.get(pid, (name, 0.0))[1])
            for pid, (name, cpu) in cpu_by_process().items()
        }
        ours = self.ranks | self.launch
        others = sorted(
            ((cpu, name, pid) for pid, (name, cpu) in used.items() if pid not in ours and cpu > 0), reverse=True
        )
        return {
            "host": platform.node(),
            "host_cpus": psutil.cpu_count() or 1,
            "window_s": window,
            "tick_s": 1 / os.sysconf("SC_CLK_TCK"),
            "host_busy_s": _busy(host) - _busy(self.host_start),
            "host_steal_s": getattr(host, "steal", 0.0) - getattr(self.host_start, "steal", 0.0),
            "host_irq_s": _interrupts(host) - _interrupts(self.host_start),
            "own_cpu_s": own,
            "launch_cpu_s": launch,
            "busiest_others": [[name, pid, round(cpu, 3)] for cpu, name, pid in others[:TOP_OTHERS]],
            "pid": os.getpid(),
        }

    def sample(self) -> None:
        self.samples.append(self.read())

    def read(self) -> dict[str, float]:
        return {}

    def finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"samples": len(self.samples), "throttle_reasons": sorted(self.reasons)}
        for key in sorted({k for sample in self.samples for k in sample}):
            values = [s[key] for s in self.samples if key in s]
            summary[key] = {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}
        # perfsuite.core.nvmlcodes says which reasons are harmless and why.
        summary["throttled"] = bool(self.reasons - HARMLESS_REASONS)
        summary["contention"] = self.contention()
        return summary

    @staticmethod
    def for_device(device: torch.device) -> HealthTracker:
        return CudaHealthTracker(device) if device.type == "cuda" else CpuHealthTracker(device)


class CpuHealthTracker(HealthTracker):
    def read(self) -> dict[str, float]:
        freq = psutil.cpu_freq()
        return {"load_avg_1m": os.getloadavg()[0], **({"cpu_mhz": freq.current} if freq else {})}


#: How many of the busiest other processes a rank names.
TOP_OTHERS = 5


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's name and CPU seconds (user + system, its threads included): 2-3 ms
    for ~100 processes, read at the two ends of the measured steps only."""
    found = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is not None:
            found[proc.pid] = (str(proc.info["name"] or "?"), float(times.user + times.system))
    return found


def _run_processes() -> tuple[set[int], set[int]]:
    """This launch's processes on this host: (the agent's descendants, the ranks among them;
    the agent and the processes above it: a warm parent, pytest, ``ab-rev``, ``make``)."""
    try:
        agent = psutil.Process(os.getppid())
        ranks = {os.getpid(), *(child.pid for child in agent.children(recursive=True))}
        return ranks, {agent.pid, *(parent.pid for parent in agent.parents())}
    except psutil.Error:
        return {os.getpid()}, set()


def _precise_cpu_s(pids: set[int]) -> float:
    """CPU seconds the processes ``pids`` have used, every thread, from the scheduler's
    nanosecond counters (``/proc/PID/task/TID/schedstat``); clock ticks where a kernel
    has none; a process gone meanwhile counts nothing."""
    total = 0.0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as stats:
                    total += int(stats.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                total += _ticks_cpu_s(pid) if tid == str(pid) else 0.0
    return total


def _ticks_cpu_s(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _interrupts(times: Any) -> float:
    """CPU seconds the host spent in interrupt handlers, which no process is charged for
    (loopback traffic between ranks is processed in softirq context)."""
    return float(getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0))


def _busy(times: Any) -> float:
    """Busy CPU seconds of the host: all but idle, iowait and steal (guest time
    is already inside user on Linux)."""
    idle = sum(getattr(times, name, 0.0) for name in ("idle", "iowait", "steal", "guest", "guest_nice"))
    return float(sum(times)) - idle


class CudaHealthTracker(HealthTracker):
    def __enter__(self) -> CudaHealthTracker:
        super().__enter__()
        self.gpu = NvmlDevice(self.device)
        self.energy_start_mj = self.energy_mj()
        self.nvml_start_us = int(time.time() * 1e6)
        return self

    def foreign_gpu_use(self) -> dict[str, Any]:
        """Other processes' SM utilisation on this GPU over the measured steps
        (NVML's per-process samples; this run's ranks are the agent's children).
        Inside a container NVML reports host pids, which match none of ours:
        then nobody can be told apart and nothing is called foreign."""
        gpu, nvml = self.gpu, self.gpu.nvml
        if gpu.nvml is None or not hasattr(nvml, "nvmlDeviceGetProcessUtilization"):
            return {}
        samples = gpu.call(
            "process utilisation", lambda: nvml.nvmlDeviceGetProcessUtilization(gpu.handle, self.nvml_start_us)
        )
        if samples is None:
            return {}
        ours = _run_pids()
        if samples and not any(int(sample.pid) in ours for sample in samples):
            return {"foreign_pids": [], "pid_namespace_mismatch": True}
        foreign: dict[int, list[float]] = {}
        for sample in samples:
            if int(sample.pid) not in ours:
                foreign.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        return {
            "foreign_pids": sorted(foreign),
            "foreign_sm_util_pct": max((sum(v) / len(v) for v in foreign.values()), default=0.0),
        }

    def energy_mj(self) -> int | None:
        """NVML's energy counter (mJ since the driver loaded; Volta and newer), if this GPU has one."""
        gpu, nvml = self.gpu, self.gpu.nvml
        if not hasattr(nvml, "nvmlDeviceGetTotalEnergyConsumption"):
            return None
        return gpu.call("energy", lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)))

    def read(self) -> dict[str, float]:
        gpu, nvml = self.gpu, self.gpu.nvml
        bits = gpu.clock_event_reasons()
        if bits is not None:
            self.reasons |= set(reasons_of(bits))
        readings = {
            "sm_clock_mhz": gpu.call(
                "SM clock", lambda: float(nvml.nvmlDeviceGetClockInfo(gpu.handle, nvml.NVML_CLOCK_SM))
            ),
            "power_w": gpu.call("power", lambda: nvml.nvmlDeviceGetPowerUsage(gpu.handle) / 1000),
            "temperature_c": gpu.call(
                "temperature", lambda: float(nvml.nvmlDeviceGetTemperature(gpu.handle, nvml.NVML_TEMPERATURE_GPU))
            ),
        }
        return {key: value for key, value in readings.items() if value is not None}

    def finish(self) -> dict[str, Any]:
        summary = super().finish()
        summary["contention"].update(self.foreign_gpu_use())
        gpu, nvml = self.gpu, self.gpu.nvml
        limit = gpu.call("power limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(gpu.handle) / 1000)
        if limit is not None:  # a lowered limit slows the card as a "power cap", which is not throttling
            summary["power_limit_w"] = limit
        end = self.energy_mj()
        if end is not None and self.energy_start_mj is not None:
            summary["energy_j"] = (end - self.energy_start_mj) / 1000  # over the measured steps
        self.gpu.shutdown()
        summary["nvml_mapped_by"] = self.gpu.mapped_by
        if self.gpu.error:
            summary["nvml_error"] = self.gpu.error
        return summary


def _run_pids() -> set[int]:
    """This run's processes on this host: the torchrun agent and its children."""
    try:
        agent = psutil.Process(os.getppid())
        return {agent.pid, os.getpid(), *(child.pid for child in agent.children(recursive=True))}
    except psutil.Error:
        return {os.getpid()}
