"""A stand-in for nvidia-ml-py's ``pynvml`` at NVML's boundary, so tests on a
machine without GPUs can present a GPU fingerprint.

Put this folder first on PYTHONPATH and list the GPUs in ``FAKE_NVML_GPUS``
(names separated by ``;``, e.g. ``NVIDIA H100 80GB HBM3;NVIDIA H100 80GB HBM3``).
Only the calls perfsuite makes are provided; each returns what real NVML would.
Other knobs, read at each call:

* ``FAKE_NVML_REASONS``: clock-event reason bits (int) every device reports;
* ``FAKE_NVML_OLD_API=1``: only the deprecated ``...ClocksThrottleReasons`` exists;
* ``FAKE_NVML_PROCS``: ``pid:bytes,...`` compute processes on every device;
* ``FAKE_NVML_FAIL``: a function name that raises NVMLError.
* ``FAKE_NVML_UUIDS``: the cards' UUIDs by index, separated by ``;`` (default
  ``GPU-00000000-0000-0000-0000-<index>``): another set of physical cards;
* ``FAKE_NVML_POWER_LIMIT_W``: the enforced power limit (default 700);
* ``FAKE_NVML_NVLINK=0``: the cards reach each other over PCIe only (default:
  18 NVLinks each, every pair over NVLink, as on an H100 SXM node).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5


class NVMLError(Exception):
    pass


@dataclass(frozen=True)
class _Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class _Handle:
    index: int
    name: str


def _check(name: str) -> None:
    if os.environ.get("FAKE_NVML_FAIL") == name:
        raise NVMLError(f"{name}: Unknown Error")


def _gpus() -> list[str]:
    return [name for name in os.environ.get("FAKE_NVML_GPUS", "").split(";") if name]


def nvmlInit() -> None:
    if not _gpus():
        raise NVMLError("NVML Shared Library Not Found")


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    return _Handle(index, _gpus()[index])


def nvmlDeviceGetName(handle: _Handle) -> str:
    return handle.name


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    listed = [uuid for uuid in os.environ.get("FAKE_NVML_UUIDS", "").split(";") if uuid]
    return listed[handle.index] if handle.index < len(listed) else f"GPU-00000000-0000-0000-0000-{handle.index:012d}"


def nvmlDeviceGetSerial(handle: _Handle) -> str:
    _check("nvmlDeviceGetSerial")
    return "1650" + nvmlDeviceGetUUID(handle)[-9:]  # a board serial: 13 digits


def nvmlDeviceGetApplicationsClock(handle: _Handle, clock: int) -> int:
    _check("nvmlDeviceGetApplicationsClock")
    return {NVML_CLOCK_SM: 1980, NVML_CLOCK_MEM: 2619}[clock]


def nvmlDeviceGetEccMode(handle: _Handle) -> list[int]:
    _check("nvmlDeviceGetEccMode")
    return [NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED]  # current, pending


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    if os.environ.get("FAKE_NVML_NVLINK") == "0":
        raise NVMLError("Not Supported")
    if link >= 18:
        raise NVMLError("Invalid Argument")
    return NVML_FEATURE_ENABLED


def nvmlDeviceGetP2PStatus(first: _Handle, second: _Handle, index: int) -> int:
    _check("nvmlDeviceGetP2PStatus")
    nvlink = os.environ.get("FAKE_NVML_NVLINK") != "0"
    return NVML_P2P_STATUS_OK if nvlink or index != NVML_P2P_CAPS_INDEX_NVLINK else NVML_P2P_STATUS_NOT_SUPPORTED


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
    total, used = 80 * 2**30, 3 * 2**30
    return _Memory(total=total, free=total - used, used=used)


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int | None


def nvmlDeviceGetHandleByUUID(uuid: str) -> _Handle:
    for index, name in enumerate(_gpus()):
        if nvmlDeviceGetUUID(_Handle(index, name)) == uuid:
            return _Handle(index, name)
    raise NVMLError("Not Found")


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Process]:
    _check("nvmlDeviceGetComputeRunningProcesses")
    listed = [p.split(":") for p in os.environ.get("FAKE_NVML_PROCS", "").split(",") if p]
    return [_Process(int(pid), int(used)) for pid, used in listed]


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    _check("nvmlDeviceGetClockInfo")
    return 1980


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    _check("nvmlDeviceGetPowerUsage")
    return 650_000  # milliwatts


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    _check("nvmlDeviceGetEnforcedPowerLimit")
    # Milliwatts: an H100/H200 SXM's 700 W unless a test sets another cap.
    return int(os.environ.get("FAKE_NVML_POWER_LIMIT_W", "700")) * 1000


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    _check("nvmlDeviceGetTemperature")
    return 61


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    _check("nvmlDeviceGetCurrentClocksThrottleReasons")
    return int(os.environ.get("FAKE_NVML_REASONS", "0"))


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    _check("nvmlDeviceGetTotalEnergyConsumption")
    # Millijoules since the driver loaded: 650 W for each second of wall time.
    return int(time.monotonic() * 650_000)


def __getattr__(name: str) -> object:
    # The current API exists unless a test asks for a driver that only has the old one.
    if name == "nvmlDeviceGetCurrentClocksEventReasons" and not os.environ.get("FAKE_NVML_OLD_API"):
        return nvmlDeviceGetCurrentClocksThrottleReasons
    raise AttributeError(name)


def nvmlSystemGetDriverVersion() -> str:
    return "580.65.06"


def nvmlSystemGetCudaDriverVersion() -> int:
    return 13000
