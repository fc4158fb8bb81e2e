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

from perfsuite.worker.nvml import NvmlDevice

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
    """Allocator peaks plus the peak device memory NVML sees for this process
    (or, where NVML cannot see the process, for the whole device)."""

    def __enter__(self) -> CudaMemoryTracker:
        # Peaks from here on: the training steps, not building and wrapping the
        # model (every rank builds the full model before a strategy shards it).
        torch.cuda.reset_peak_memory_stats(self.device)
        self._gpu = NvmlDevice(self.device)
        self._nvml_peak = 0
        self._nvml_scope = ""
        return self

    def sample(self) -> None:
        found = self._gpu.process_memory()
        if found is not None:
            self._nvml_peak = max(self._nvml_peak, found[0])
            self._nvml_scope = found[1]

    def finish(self) -> MemoryResult:
        self.sample()
        self._gpu.shutdown()
        allocated = torch.cuda.max_memory_allocated(self.device) / MIB
        reserved = torch.cuda.max_memory_reserved(self.device) / MIB
        detail: dict[str, Any] = {"max_allocated_mib": allocated, "max_reserved_mib": reserved}
        if self._nvml_scope:
            # "device" where NVML's PIDs (host PIDs) do not include ours, as in containers.
            detail["nvml_peak_mib"] = self._nvml_peak / MIB
            detail["nvml_scope"] = self._nvml_scope
        if self._gpu.error:
            detail["nvml_error"] = self._gpu.error
        return MemoryResult(allocated, detail)
