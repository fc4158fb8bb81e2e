"""Machine fingerprint: what a baseline was recorded on.

Read in the pytest process without importing torch or touching CUDA: GPUs and the
driver come from NVML (``pynvml`` does not create a CUDA context), package
versions from installed metadata. The worker adds what only a live torch can
tell (torch's CUDA and NCCL versions) under ``"runtime"``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

from perfsuite.engines import ENGINES

#: Packages every run depends on; engines add theirs (EngineSpec.packages).
CORE_PACKAGES = ("torch", "transformers", "perfsuite")


def tracked_packages() -> tuple[str, ...]:
    """Packages whose version changes are worth flagging next to a verdict."""
    engines = (name for spec in ENGINES for name in spec.packages)
    return tuple(dict.fromkeys((*CORE_PACKAGES, *engines)))


def package_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for name in tracked_packages():
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _nvml_gpus() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """GPUs visible to this process and driver facts; empty without NVML."""
    try:
        import pynvml
    except ImportError:
        return [], {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return [], {}
    try:
        gpus = []
        for index, handle in visible_devices(pynvml):
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "memory_mib": memory.total // 2**20,
                }
            )
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        driver = {
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
        return gpus, driver
    finally:
        pynvml.nvmlShutdown()


def visible_devices(nvml: Any) -> list[tuple[int | str, Any]]:
    """(label, NVML handle) of each device CUDA_VISIBLE_DEVICES leaves visible,
    in CUDA's order: indices (``0,2``) or UUIDs (``GPU-...``, ``MIG-...``, as
    schedulers and MIG set them). CUDA stops at the first entry it cannot use,
    and so does this."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = nvml.nvmlDeviceGetCount()
    if spec is None:
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    found: list[tuple[int | str, Any]] = []
    for part in (p.strip() for p in spec.split(",")):
        try:
            if part.isdigit() and int(part) < count:
                found.append((int(part), nvml.nvmlDeviceGetHandleByIndex(int(part))))
            elif part.startswith(("GPU-", "MIG-")):
                found.append((part, nvml.nvmlDeviceGetHandleByUUID(part)))
            else:
                break
        except nvml.NVMLError:
            break
    return found


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def machine_fingerprint() -> dict[str, Any]:
    """Fingerprint of this machine, cheap enough to take once per session."""
    gpus, driver = _nvml_gpus()
    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "gpus": gpus,
        "gpu_count": len(gpus),
        **driver,
        "packages": package_versions(),
    }


#: Fingerprint fields whose change means the stack, not the code, may have moved.
STACK_FIELDS = ("driver", "cuda_driver", "gpu_count")


def stack_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences in hardware and software stack."""
    changes = []
    old_gpu = (recorded.get("gpus") or [{}])[0].get("name")
    new_gpu = (current.get("gpus") or [{}])[0].get("name")
    if old_gpu != new_gpu:
        changes.append(f"GPU {old_gpu} -> {new_gpu}")
    for key in STACK_FIELDS:
        if recorded.get(key) != current.get(key):
            changes.append(f"{key} {recorded.get(key)} -> {current.get(key)}")
    for section in ("packages", "runtime"):
        old, new = recorded.get(section) or {}, current.get(section) or {}
        if not old or not new:
            # Not known on one side (runtime comes from a rank 0 that reported:
            # a session whose first launch ran out of memory has none yet).
            continue
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                changes.append(f"{name} {old.get(name)} -> {new.get(name)}")
    return changes


def foreign_gpu_processes() -> list[dict[str, Any]]:
    """Compute processes on the visible GPUs that are not this process.

    Another job on the card skews every timing; perfsuite reports it rather
    than touching the other process or any GPU setting.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        found = []
        for index, handle in visible_devices(pynvml):
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid != os.getpid():
                    mib = (proc.usedGpuMemory or 0) // 2**20
                    found.append({"gpu": index, "pid": proc.pid, "used_mib": mib})
        return found
    finally:
        pynvml.nvmlShutdown()
