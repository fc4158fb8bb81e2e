"""Machine health during measurement: is the hardware running as it should?

On CUDA, NVML is sampled once per measured step: SM clock, power draw,
temperature and the clock-event (throttle) reasons, which say *why* clocks
dropped (power cap, thermal, hardware slowdown). On CPU, load average and
current frequency are sampled: another busy process shows up as load above
this run's ranks. Nothing here changes any setting.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil
import torch

from perfsuite.worker.runtime import physical_gpu_index

# NVML clock-event reasons that mean "slower than the card can go" (the idle
# and application-clock-setting bits are left out: they are not throttling).
THROTTLE_REASONS = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}


class HealthTracker:
    """Context manager; ``sample()`` per step; ``result`` afterwards."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.samples: list[dict[str, float]] = []
        self.reasons: set[str] = set()
        self.result: dict[str, Any] = {}

    def __enter__(self) -> HealthTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = self.finish()

    def sample(self) -> None:
        self.samples.append(self.read())

    def read(self) -> dict[str, float]:
        return {}

    def finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"samples": len(self.samples), "throttle_reasons": sorted(self.reasons)}
        for key in self.samples[0] if self.samples else {}:
            values = [s[key] for s in self.samples]
            summary[key] = {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}
        summary["throttled"] = bool(self.reasons)
        return summary

    @staticmethod
    def for_device(device: torch.device) -> HealthTracker:
        return CudaHealthTracker(device) if device.type == "cuda" else CpuHealthTracker(device)


class CpuHealthTracker(HealthTracker):
    def read(self) -> dict[str, float]:
        freq = psutil.cpu_freq()
        return {"load_avg_1m": os.getloadavg()[0], **({"cpu_mhz": freq.current} if freq else {})}


class CudaHealthTracker(HealthTracker):
    def __enter__(self) -> CudaHealthTracker:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(physical_gpu_index(self.device.index or 0))
        return self

    def read(self) -> dict[str, float]:
        nvml, handle = self.nvml, self.handle
        reasons_fn: Callable[[Any], int] = getattr(
            nvml, "nvmlDeviceGetCurrentClocksEventReasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        bits = reasons_fn(handle)
        self.reasons |= {name for name, bit in THROTTLE_REASONS.items() if bits & bit}
        return {
            "sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        }

    def finish(self) -> dict[str, Any]:
        summary = super().finish()
        self.nvml.nvmlShutdown()
        return summary
