"""The cpu peak means the run's memory (issue 26): file-backed pages mapped
during the measured steps (as torch's shared libraries are) leave it alone;
anonymous memory raises it by what was allocated.

Each case runs in a fresh interpreter, as a rank does, so VmHWM and the page
cache state of one case cannot leak into another.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")

MIB = 2**20
SIZE_MIB = 200

PROGRAM = textwrap.dedent(
    """
    import json, mmap, sys
    import torch
    from perfsuite.rank.worker.memory import MemoryTracker

    MIB = 2 ** 20
    path, size = sys.argv[1], int(sys.argv[2]) * MIB

    def measured(step):
        tracker = MemoryTracker.for_device(torch.device("cpu"))
        with tracker:
            kept = step()
            tracker.sample()
        return tracker.result.peak_mem_mib, tracker.result.detail, kept

    def nothing():
        return None

    def mapped_file():
        # Mapped and touched page by page, then kept mapped through the step, as a library is.
        f = open(path, "rb")
        view = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        total = sum(view[i] for i in range(0, len(view), 4096))
        return (f, view, total)

    def anonymous():
        block = bytearray(size)
        for i in range(0, size, 4096):
            block[i] = 1
        return block

    out = {}
    for name, step in (("control", nothing), ("file", mapped_file), ("anon", anonymous)):
        peak, detail, kept = measured(step)
        out[name] = {"peak": peak, "detail": detail}
        del kept
    print(json.dumps(out))
    """
)


def run_cases(tmp_path: Path) -> dict[str, dict]:
    data = tmp_path / "data.bin"
    with data.open("wb") as f:  # written in 1 MiB chunks, as pip 26 writes a wheel's files
        for _ in range(SIZE_MIB):
            f.write(b"\x01" * MIB)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(data), str(SIZE_MIB)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mapped_files_leave_the_peak_alone_and_anonymous_memory_raises_it(tmp_path: Path) -> None:
    cases = run_cases(tmp_path)
    control, mapped, anon = (cases[k]["peak"] for k in ("control", "file", "anon"))
    detail = cases["file"]["detail"]
    # The mapped file is in the raw resident peak, but not in the gated figure.
    assert detail["peak_rss_mib"] - cases["control"]["detail"]["peak_rss_mib"] > SIZE_MIB * 0.9, cases
    assert abs(mapped - control) <= 0.02 * control, cases
    assert detail["rss_file_moved"] is True  # the file-backed set grew by 200 MiB during the step: said
    assert anon - control == pytest.approx(SIZE_MIB, rel=0.05), cases
    assert detail["definition"] == "VmHWM - RssFile - RssShmem over the measured steps"
