"""Device check only, for docs/gpu-runs/next/device-call.sh.

As a pytest plugin (``-p oomcheck``): a cuda profile capped at 20 GiB, under which GPT-1.3B
fp32 DDP at one rank (~30 GiB) runs out of memory. It is not cuda-32gb, so the row expects
to fit, the OOM fails it, and perfsuite records the allocations before it (any CUDA OOM).

As a script (``python oomcheck.py FOLDER``): what each allocator snapshot under FOLDER holds:
live blocks, and the timeline (``device_traces``) the memory_viz viewer draws.
"""

from __future__ import annotations

import pickle
import sys
from dataclasses import replace
from pathlib import Path

from perfsuite.core.profiles import BUILTIN_PROFILES, HardwareProfile


def pytest_perfsuite_profiles() -> list[HardwareProfile]:
    capped = replace(BUILTIN_PROFILES["cuda-32gb"], name="cuda-20gb-oomcheck", device_memory_cap_mib=20 * 1024)
    return [replace(capped, description="device check: 20 GiB per rank, to get a CUDA OOM and its snapshot")]


def describe(folder: Path) -> list[str]:
    lines = []
    for path in sorted(folder.rglob("*.pickle")):
        snapshot = pickle.loads(path.read_bytes())
        blocks = [b for s in snapshot.get("segments", []) for b in s.get("blocks", [])]
        live = [b for b in blocks if b.get("state") == "active_allocated"]
        traces = snapshot.get("device_traces") or []
        events = sum(len(t) for t in traces)
        lines.append(
            f"{path}: {path.stat().st_size} bytes, {len(live)} live blocks "
            f"({sum(b.get('size', 0) for b in live) / 2**20:.0f} MiB), timeline: {events} events "
            f"on {len(traces)} device(s)"
        )
    return lines or [f"no allocator snapshot under {folder}"]


if __name__ == "__main__":
    print("\n".join(describe(Path(sys.argv[1]))))
