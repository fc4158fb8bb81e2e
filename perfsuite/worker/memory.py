"""Memory measurement inside a rank.

Peak memory is noisy and allocator-dependent, taken over the measured steps:
on CUDA the caching allocator's peaks plus the process's device memory as NVML
sees it; on CPU the peak resident set (VmHWM, reset when measuring starts).
(The exact figure, model-state bytes, is counted by
:func:`perfsuite.primitives.count_state_bytes`.)
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from perfsuite.worker.runtime import physical_gpu_index

MIB = 2**20


@dataclass
class MemoryResult:
    peak_mem_mib: float
    detail: dict[str, Any] = field(default_factory=dict)


class MemoryTracker:
    """Context manager around the training run; ``sample()`` once per step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.result = MemoryResult(0.0)

    def __enter__(self) -> MemoryTracker:
        return self

    def sample(self) -> None:
        """Take a point-in-time reading where the tracker needs one."""

    def __exit__(self, *exc: object) -> None:
        self.result = self.finish()

    def finish(self) -> MemoryResult:
        raise NotImplementedError

    @staticmethod
    def for_device(device: torch.device) -> MemoryTracker:
        return CudaMemoryTracker(device) if device.type == "cuda" else CpuMemoryTracker(device)


class CpuMemoryTracker(MemoryTracker):
    def __enter__(self) -> CpuMemoryTracker:
        # Reset the peak RSS so it is the training peak, not model construction
        # (Linux: writing 5 to clear_refs resets VmHWM); elsewhere it covers the run.
        try:
            with open(f"/proc/{os.getpid()}/clear_refs", "w") as refs:
                refs.write("5")
        except OSError:
            pass
        return self

    def finish(self) -> MemoryResult:
        peak = peak_rss_mib()
        return MemoryResult(peak, {"peak_rss_mib": peak})


def peak_rss_mib() -> float:
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / MIB if sys.platform == "darwin" else ru / 1024  # macOS: bytes, Linux: KiB


class CudaMemoryTracker(MemoryTracker):
    """Allocator peaks plus the peak NVML-visible device memory of this process."""

    def __enter__(self) -> CudaMemoryTracker:
        import pynvml

        # Peaks from here on: the training steps, not building and wrapping the
        # model (every rank builds the full model before a strategy shards it).
        torch.cuda.reset_peak_memory_stats(self.device)
        pynvml.nvmlInit()
        index = self.device.index if self.device.index is not None else 0
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(physical_gpu_index(index))
        self._nvml_peak = 0
        return self

    def sample(self) -> None:
        pid = os.getpid()
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                self._nvml_peak = max(self._nvml_peak, proc.usedGpuMemory)

    def finish(self) -> MemoryResult:
        self.sample()
        self._nvml.nvmlShutdown()
        allocated = torch.cuda.max_memory_allocated(self.device) / MIB
        reserved = torch.cuda.max_memory_reserved(self.device) / MIB
        return MemoryResult(
            allocated,
            {
                "max_allocated_mib": allocated,
                "max_reserved_mib": reserved,
                "nvml_process_peak_mib": self._nvml_peak / MIB,
            },
        )
