"""NVML readings of every visible GPU at idle, for the bootstrap's doctor step.

A card that is already throttled (power cap, thermal, hardware slowdown) or
busy with another process before anything runs will measure low: the report
says so next to the ceilings. Read in the pytest side's process through
``pynvml`` (no CUDA context). Any NVML failure, and sandboxes where a call is
missing or refused (gVisor's process list), degrade to a note; nothing raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from perfsuite.core.nvmlcodes import HARMLESS_REASONS, reasons_of
from perfsuite.launch.fingerprint import visible_devices

T = TypeVar("T")


def _read(notes: list[str], what: str, fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception as exc:  # NVMLError, AttributeError on old bindings: a note, never a crash
        notes.append(f"{what}: {type(exc).__name__}: {exc}")
        return None


def _gpu(nvml: Any, label: int | str, handle: Any) -> dict[str, Any]:
    notes: list[str] = []
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    bits = _read(notes, "clock event reasons", lambda: int(reasons_fn(handle))) if reasons_fn else None
    reasons = reasons_of(bits) if bits is not None else []
    procs = _read(notes, "process list", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    power = _read(notes, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
    return {
        "index": label,
        "sm_clock_mhz": _read(notes, "SM clock", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
        "mem_clock_mhz": _read(
            notes, "memory clock", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
        ),
        "power_w": power,
        "temperature_c": _read(
            notes, "temperature", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        ),
        "throttle_reasons": reasons,
        "throttled_at_idle": bool(set(reasons) - HARMLESS_REASONS),
        "other_processes": None if procs is None else len(procs),
        "notes": notes,
    }


def idle_readings() -> dict[str, Any]:
    """``{"gpus": [...], "note": str}``; an empty list where there is no NVML."""
    try:
        import pynvml
    except ImportError:
        return {"gpus": [], "note": "no pynvml (nvidia-ml-py): no GPU readings"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver: a cpu machine
        return {"gpus": [], "note": f"NVML unavailable: {type(exc).__name__}: {exc}"}
    try:
        return {"gpus": [_gpu(pynvml, label, handle) for label, handle in visible_devices(pynvml)], "note": ""}
    except Exception as exc:  # enumeration itself failed
        return {"gpus": [], "note": f"NVML enumeration failed: {type(exc).__name__}: {exc}"}
    finally:
        _read([], "shutdown", pynvml.nvmlShutdown)
