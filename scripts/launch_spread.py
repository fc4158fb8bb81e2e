"""Launch a repository's bench_tests N times, each in a fresh pytest session, and print each
launch's throughput, median step, per-step spread and the contention it measured (issue 55).

    python scripts/launch_spread.py REPO N [PYTEST ARGS...]

REPO is a repository made by ``python -m perfsuite init`` (its one row); docs/lab/contention.md
has the figures it printed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path


def main(repo: Path, launches: int, extra: list[str]) -> None:
    for i in range(launches):
        out = repo / f"r{i}.json"
        argv = [sys.executable, "-m", "pytest", "bench_tests", "-q", "-p", "no:cacheprovider", f"--perf-json={out}"]
        subprocess.run([*argv, "--perf-allow-unjudged", "--perf-op-profiles=off", *extra], cwd=repo, check=False)
        result = json.loads(out.read_text())["results"][0]
        metrics, steps = result["metrics"], result["metrics"]["step_times_s"]
        busy, window = metrics.get("contention", {}), metrics["health"][0]["contention"]["window_s"]
        print(
            f"{i}: {metrics['samples_per_s']['mean']:8.1f} samples/s, step {statistics.median(steps) * 1e3:6.1f} ms, "
            f"cv {statistics.pstdev(steps) / statistics.mean(steps):.3f}, window {window:.2f} s, foreign "
            f"{busy.get('foreign_cores')} +- {busy.get('resolution_cores')}, steal {busy.get('steal_cores')}, "
            f"others {busy.get('others')}, {result['launch'].get('rank_start')}",
            flush=True,
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
