"""Warm against exec launches, from results files named ``<row>-<start><n>.json``
(scripts/launch_overhead.sh, and the GPU call's stage 3): per row and start, the launch
overhead, the wall time, the warm parent's imports, throughput and peak memory, and what
differs between the two ways of starting (docs/lab/launch-overhead.md).

    python scripts/launch_overhead_summary.py DIR
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

NAME = re.compile(r"(?P<row>.+)-(?P<start>warm|fork|exec)(?P<n>\d+)\.json$")


def figures(result: dict[str, Any]) -> dict[str, Any]:
    metrics, launch = result.get("metrics") or {}, result.get("launch") or {}
    # The row's rate: its first figure with a mean (samples_per_s, mem_gbps...), not a time.
    rates = [k for k, v in metrics.items() if isinstance(v, dict) and "mean" in v and k != "step_time_s"]
    rate = metrics[rates[0]]["mean"] if rates else None
    allocated = [(r.get("memory") or {}).get("max_allocated_mib") for r in metrics.get("per_rank") or []]
    return {
        "id": result["id"],
        "status": result["status"],
        "started": launch.get("rank_start"),
        "overhead_s": launch.get("overhead_s"),
        "wall_s": result.get("wall_s"),
        "rate": rate,
        "peak_mem_mib": metrics.get("peak_mem_mib"),
        "max_allocated_mib": allocated if any(a is not None for a in allocated) else None,
        "parent_imports_s": (launch.get("warm") or {}).get("imports_s"),
    }


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(folder: Path) -> int:
    rows: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.glob("*.json")):
        match = NAME.match(path.name)
        if match:
            for result in json.loads(path.read_text())["results"]:
                rows[match["row"]][match["start"]].append(figures(result))
    for row, starts in rows.items():
        ids = sorted({f["id"] for runs in starts.values() for f in runs})
        print(f"{row}: {', '.join(ids)}")
        for start, runs in sorted(starts.items()):
            ok = [f for f in runs if f["status"] == "ok"]
            print(f"  {start}: {len(ok)}/{len(runs)} ok, started {sorted({str(f['started']) for f in runs})}")
            for key in ("overhead_s", "wall_s", "rate", "peak_mem_mib", "parent_imports_s"):
                print(f"    {key:17} {spread([f[key] for f in ok if f[key] is not None])}")
            allocated = {json.dumps(f["max_allocated_mib"]) for f in ok if f["max_allocated_mib"] is not None}
            if allocated:
                print(f"    max_allocated_mib {' | '.join(sorted(allocated))}")
        rates = {s: [f["rate"] for f in runs if f["rate"]] for s, runs in starts.items()}
        if rates.get("warm") and rates.get("exec"):
            ratio = statistics.median(rates["warm"]) / statistics.median(rates["exec"]) - 1
            print(f"  throughput warm against exec (medians): {ratio:+.1%}")
    if not rows:
        print(f"no <row>-<start><n>.json results in {folder}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
