"""Machine health during measurement: is the hardware running as it should?

On CUDA, NVML is sampled once per measured step: SM clock, power draw,
temperature and the clock-event (throttle) reasons, which say *why* clocks
dropped (power cap, thermal, hardware slowdown); the energy counter is read
before and after the measured steps. On CPU, load average and
current frequency are sampled: another busy process shows up as load above
this run's ranks. Nothing here changes any setting.
"""

from __future__ import annotations

import os
from typing import Any

import psutil
import torch

from perfsuite.worker.nvml import NvmlDevice

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
        for key in sorted({k for sample in self.samples for k in sample}):
            values = [s[key] for s in self.samples if key in s]
            summary[key] = {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}
        # Sync boost only aligns clocks across GPUs of one group; the others slow the card.
        summary["throttled"] = bool(self.reasons - {"sync_boost"})
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
        self.gpu = NvmlDevice(self.device)
        self.energy_start_mj = self.energy_mj()
        return self

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
            self.reasons |= {name for name, bit in THROTTLE_REASONS.items() if bits & bit}
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
        end = self.energy_mj()
        if end is not None and self.energy_start_mj is not None:
            summary["energy_j"] = (end - self.energy_start_mj) / 1000  # over the measured steps
        self.gpu.shutdown()
        summary["nvml_mapped_by"] = self.gpu.mapped_by
        if self.gpu.error:
            summary["nvml_error"] = self.gpu.error
        return summary
