"""NVML's view of this rank's GPU, made safe to use during a measurement.

* The CUDA device is matched to its NVML device by UUID (right under
  UUID- or MIG-style ``CUDA_VISIBLE_DEVICES`` and CUDA's FASTEST_FIRST order);
  only if that fails by index through ``CUDA_VISIBLE_DEVICES``.
* Clock-event (throttle) reasons use the current API,
  ``nvmlDeviceGetCurrentClocksEventReasons``, and the deprecated throttle call
  only where a driver lacks it; both are looked up when needed.
* Per-process memory: NVML reports host PIDs, which inside a container do not
  match ``os.getpid()``; then the device-level figure is used and the result
  says so.
* Any NVML failure is recorded (``error``) and turns further calls into
  no-ops: it degrades the health record, never the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from perfsuite.rank.worker.runtime import physical_gpu_index

T = TypeVar("T")


def cuda_uuid(device: torch.device) -> str | None:
    """NVML-style UUID (``GPU-...``) of a CUDA device, None where torch cannot tell."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # no CUDA, or a torch without .uuid: fall back to indices
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


class NvmlDevice:
    """One GPU through NVML; ``error`` holds the first failure, after which calls return None."""

    def __init__(self, device: torch.device) -> None:
        self.error = ""
        self.mapped_by = ""
        self.nvml: Any = None
        self.handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = self._handle(device)
        except Exception as exc:  # ImportError or NVMLError: no NVML figures
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"

    def _handle(self, device: torch.device) -> Any:
        uuid = cuda_uuid(device)
        if uuid is not None:
            try:
                handle = self.nvml.nvmlDeviceGetHandleByUUID(uuid)
                self.mapped_by = "uuid"
                return handle
            except self.nvml.NVMLError:
                pass
        self.mapped_by = "index"
        return self.nvml.nvmlDeviceGetHandleByIndex(physical_gpu_index(device.index or 0))

    @property
    def ok(self) -> bool:
        return self.handle is not None and not self.error

    def call(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None (recording the first error) once NVML has failed."""
        if not self.ok:
            return None
        try:
            return fn()
        except Exception as exc:  # NVMLError and friends degrade, never raise
            self.error = f"{what} failed: {type(exc).__name__}: {exc}"
            return None

    def clock_event_reasons(self) -> int | None:
        nvml = self.nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if fn is None:
            return None
        value: int | None = self.call("clock event reasons", lambda: fn(self.handle))
        return value

    def process_memory(self) -> tuple[int, str] | None:
        """(bytes, scope): this process's device memory (scope ``process``), or the
        whole device's (``device``) where NVML does not list our PID (containers)."""
        procs = self.call("process list", lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
        if procs is None:
            return None
        pid = os.getpid()
        mine = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
        if mine:
            return int(mine[0]), "process"
        info = self.call("memory info", lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle))
        return (int(info.used), "device") if info is not None else None

    def shutdown(self) -> None:
        if self.nvml is not None and self.handle is not None:
            self.call("shutdown", self.nvml.nvmlShutdown)
