"""This host's processor: what decides which CPU kernels run and how fast.

Two VMs that both say ``x86_64`` can differ twofold in bf16 matmul speed (the
cpu VM measured 0.33 against 0.65 TFLOP/s in different sessions): one has
AVX-512 with bf16 or AMX, the other only AVX2. A cpu baseline is comparable
only on the processor that recorded it, so the fingerprint keeps its vendor,
model name, family/model/stepping, logical core count and the instruction-set
features that select kernels (oneDNN and ATen dispatch on them).

Read from ``/proc/cpuinfo``, the kernel's own answer. Not py-cpuinfo: it starts
a Python subprocess on every call (0.20 s measured here, in every pytest run),
and two distributions installed beside perfsuite ship a module named
``cpuinfo`` (py-cpuinfo from DeepSpeed, py-cpuinfo2 from pytest-benchmark), so
which one answers depends on install order. Off Linux, ``platform`` gives the
model only. Stdlib only: shared by every side.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")

#: Processor fields that make two processors the same one for timing purposes.
PROCESSOR_FIELDS = ("vendor", "model", "family", "model_number", "stepping", "cores", "features")

#: Instruction-set features that change which kernels run (x86 flag names as
#: Linux spells them; aarch64's ``Features``). Others (sse, aes, ...) are on
#: every machine that runs torch or never touched by its matmuls.
KERNEL_FEATURES = (
    # x86: the AVX2 and AVX-512 paths, their bf16/fp16 and VNNI (int8) parts, AMX tiles
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    # aarch64: NEON, SVE, bf16 and int8 matrix multiply
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
    "svebf16",
    "svei8mm",
)

#: ``/proc/cpuinfo`` keys per fingerprint field, x86 first, then aarch64's.
_FIELDS = {
    "vendor": ("vendor_id", "CPU implementer"),
    "model": ("model name", "Processor"),
    "family": ("cpu family", "CPU architecture"),
    "model_number": ("model", "CPU part"),
    "stepping": ("stepping", "CPU revision"),
    "features": ("flags", "Features"),
}


def processor(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """This host's processor: vendor, model, family, model_number, stepping, cores, features."""
    first = _first_block(cpuinfo)
    found = {name: next((first[k] for k in keys if k in first), "") for name, keys in _FIELDS.items()}
    flags = set(found.pop("features").split())
    return {
        **found,
        "model": found["model"] or platform.processor() or platform.machine(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "features": [name for name in KERNEL_FEATURES if name in flags],
    }


def _first_block(cpuinfo: Path) -> dict[str, str]:
    """The first logical CPU's ``key: value`` lines (every CPU of one host reports the same
    model). aarch64 puts some keys after the per-CPU blocks, so those are read too."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in found:
            found[key.strip()] = value.strip()
    return found


def describe(proc: Mapping[str, Any]) -> str:
    """One processor in a verdict: ``AMD EPYC (AuthenticAMD 25/1/1, 2 cores; avx avx2 fma f16c)``."""
    numbers = "/".join(str(proc.get(k, "?")) for k in ("family", "model_number", "stepping"))
    features = " ".join(proc.get("features") or []) or "none of the kernel features"
    return f"{proc.get('model')} ({proc.get('vendor')} {numbers}, {proc.get('cores')} cores; {features})"


def key(proc: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two processors the same one for timing purposes (:data:`PROCESSOR_FIELDS`)."""
    return tuple(str(proc.get(name)) for name in PROCESSOR_FIELDS)
