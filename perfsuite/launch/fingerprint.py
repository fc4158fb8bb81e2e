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
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from perfsuite.core.engines import ENGINES
from perfsuite.core.processor import processor
from perfsuite.launch.identity import card_setting_changes

T = TypeVar("T")

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


def _nvml_gpus() -> tuple[list[dict[str, Any]], dict[str, Any]]:
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
        visible = visible_devices(pynvml)
        gpus = [card(pynvml, index, handle) for index, handle in visible]
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        driver = {
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "interconnect": interconnect(pynvml, [handle for _, handle in visible]),
        }
        return gpus, driver
    finally:
        pynvml.nvmlShutdown()


def card(nvml: Any, index: int | str, handle: Any) -> dict[str, Any]:
    """One GPU as a baseline remembers it: which card (UUID, serial) and the settings that
    bound its speed (enforced power limit, application clocks, ECC, active NVLinks). A
    reading the card, driver or bindings refuse (a serial on a consumer card, clocks under
    MIG, a call older bindings lack) is None."""
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    ecc = _maybe(lambda: nvml.nvmlDeviceGetEccMode(handle)[0] == nvml.NVML_FEATURE_ENABLED)
    return {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "memory_mib": memory.total // 2**20,
        "uuid": _maybe(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        "serial": _maybe(lambda: _text(nvml.nvmlDeviceGetSerial(handle))),
        "power_limit_w": _maybe(lambda: round(nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)),
        "app_clocks_mhz": {
            "sm": _maybe(lambda: int(nvml.nvmlDeviceGetApplicationsClock(handle, nvml.NVML_CLOCK_SM))),
            "mem": _maybe(lambda: int(nvml.nvmlDeviceGetApplicationsClock(handle, nvml.NVML_CLOCK_MEM))),
        },
        "ecc": ecc,
        "nvlinks": _active_nvlinks(nvml, handle),
    }


def _active_nvlinks(nvml: Any, handle: Any) -> int | None:
    """NVLinks up on one card; None where NVML cannot tell (no NVLink on the card: NotSupported)."""

    def up(link: int) -> bool:
        return bool(nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED)

    links = [_maybe(partial(up, link)) for link in range(_maybe(lambda: nvml.NVML_NVLINK_MAX_LINKS) or 0)]
    known = [state for state in links if state is not None]
    return sum(known) if known else None


def interconnect(nvml: Any, handles: list[Any]) -> str | None:
    """How the visible GPUs reach each other: ``nvlink`` (every pair), ``pcie`` (none),
    ``nvlink+pcie`` (some pairs); None with one GPU or where NVML cannot tell."""

    def nvlink(first: Any, second: Any) -> bool:
        status = nvml.nvmlDeviceGetP2PStatus(first, second, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        return bool(status == nvml.NVML_P2P_STATUS_OK)

    kinds = set()
    for i, first in enumerate(handles):
        for second in handles[i + 1 :]:
            linked = _maybe(partial(nvlink, first, second))
            if linked is not None:
                kinds.add("nvlink" if linked else "pcie")
    return "+".join(sorted(kinds)) or None


def _maybe(read: Callable[[], T]) -> T | None:
    # A missing reading (NotSupported, NoPermission, bindings too old for the call)
    # leaves that field unknown; the fingerprint itself never fails over one.
    try:
        return read()
    except Exception:
        return None


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
        "processor": processor(),
        "python": platform.python_version(),
        "gpus": gpus,
        "gpu_count": len(gpus),
        **driver,
        "packages": package_versions(),
    }


#: Runtime facts the ranks report since a later perfsuite version (worker.runtime): absent
#: from older baselines, so their appearance alone is no change of stack.
NEW_RUNTIME_FACTS = ("cpu_capability",)
#: Fingerprint fields whose change means the stack, not the code, may have moved.
STACK_FIELDS = ("driver", "cuda_driver", "gpu_count")


def stack_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Human-readable differences in hardware and software stack. Which processor and cards
    measured is :mod:`perfsuite.launch.identity`'s; the cards' speed settings are listed here."""
    changes = []
    old_gpu = (recorded.get("gpus") or [{}])[0].get("name")
    new_gpu = (current.get("gpus") or [{}])[0].get("name")
    if old_gpu != new_gpu:
        changes.append(f"GPU {old_gpu} -> {new_gpu}")
    for key in STACK_FIELDS:
        if recorded.get(key) != current.get(key):
            changes.append(f"{key} {recorded.get(key)} -> {current.get(key)}")
    changes += card_setting_changes(recorded, current)
    for section in ("packages", "runtime"):
        old, new = recorded.get(section) or {}, current.get(section) or {}
        if not old or not new:
            # Not known on one side (runtime comes from a rank 0 that reported:
            # a session whose first launch ran out of memory has none yet).
            continue
        # A runtime fact this perfsuite reports and an older one did not is no change of stack.
        names = (set(old) | set(new)) - (set(NEW_RUNTIME_FACTS) - set(old) if section == "runtime" else set())
        for name in sorted(names):
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
