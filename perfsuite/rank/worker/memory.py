"""Memory measurement inside a rank.

Peak memory is noisy and allocator-dependent, taken over the measured steps:
on CUDA the caching allocator's peaks plus the process's device memory as NVML
sees it; on CPU the peak of anonymous memory (VmHWM less the file-backed and
shared-memory pages, see :class:`CpuMemoryTracker`).
(The exact figure, model-state bytes, is counted by
:func:`perfsuite.rank.primitives.count_state_bytes`.)
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from perfsuite.rank.worker.nvml import NvmlDevice

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


#: RssFile may move this much (relative) over the measured steps before the peak is flagged:
#: the peak subtracts RssFile read at the end, so a file-backed set that changed makes it approximate.
RSS_FILE_DRIFT = 0.02


class CpuMemoryTracker(MemoryTracker):
    """The rank's anonymous-memory peak over the measured steps, in MiB.

    Defined as ``VmHWM - RssFile - RssShmem``: the peak resident set (reset when
    measuring starts) less the file-backed and shared-memory pages resident at
    the end. File-backed pages are mostly torch's mapped shared libraries, and
    how many of them a touch maps depends on the page cache (how the ``.so``
    files were last written or read: pip 23 and pip 26 differ), not on the code
    under test. The kernel keeps no high-water mark of anonymous memory alone,
    so the file-backed part at the peak is taken as the one at the end; when
    RssFile moved by more than 2% over the steps the detail says so
    (``rss_file_moved``). The largest ``RssAnon`` seen at a per-step sample is a
    floor. A rank forked from its agent (``rank_start=fork``) counts the pages it
    inherited from the agent in full, as VmHWM does, whether or not they are
    still shared copy-on-write. Raw VmHWM, RssFile and RssShmem stay in the detail.
    """

    def __enter__(self) -> CpuMemoryTracker:
        # Reset the peak RSS so it is the training peak, not model construction
        # (Linux: writing 5 to clear_refs resets VmHWM); elsewhere it covers the run.
        try:
            with open(f"/proc/{os.getpid()}/clear_refs", "w") as refs:
                refs.write("5")
        except OSError:
            pass
        self._start = proc_status()
        self._anon_peak = self._start.get("RssAnon", 0.0)
        return self

    def sample(self) -> None:
        self._anon_peak = max(self._anon_peak, proc_status().get("RssAnon", 0.0))

    def finish(self) -> MemoryResult:
        end = proc_status()
        if "VmHWM" not in end or "RssFile" not in end:  # not Linux: the whole resident peak
            peak = peak_rss_mib()
            return MemoryResult(peak, {"peak_rss_mib": peak, "definition": "peak resident set (ru_maxrss)"})
        self._anon_peak = max(self._anon_peak, end.get("RssAnon", 0.0))
        anon = end["VmHWM"] - end["RssFile"] - end.get("RssShmem", 0.0)
        before = self._start.get("RssFile", 0.0)
        detail: dict[str, Any] = {
            "definition": "VmHWM - RssFile - RssShmem over the measured steps",
            "peak_rss_mib": end["VmHWM"],
            "rss_file_mib": end["RssFile"],
            "rss_file_start_mib": before,
            "rss_shmem_mib": end.get("RssShmem", 0.0),
            "rss_anon_sampled_peak_mib": self._anon_peak,
        }
        if before and abs(end["RssFile"] - before) > RSS_FILE_DRIFT * before:
            detail["rss_file_moved"] = True
        return MemoryResult(max(anon, self._anon_peak), detail)


def proc_status() -> dict[str, float]:
    """This process's memory lines of ``/proc/self/status`` in MiB ({} where there is none)."""
    found: dict[str, float] = {}
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key.startswith(("Vm", "Rss")) and value.strip().endswith("kB"):
                    found[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return found


def peak_rss_mib() -> float:
    found = proc_status().get("VmHWM")
    if found is not None:
        return found
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
