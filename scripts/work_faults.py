"""Planted faults against the work gate (issue 56), in a repository made by ``perfsuite init``.

    python scripts/work_faults.py DIR RUNS

Makes DIR (``perfsuite init``, its example row at world size 2 with an optimizer factory of its
own), records its baselines, then runs the gate RUNS times on unchanged code and RUNS times with
each planted fault, and prints each run's verdict and the first words of its message:

* ``item``: a ``.item()`` in every block's forward (a host sync);
* ``foreach``: the team's AdamW factory with ``foreach=False`` (one kernel per parameter);
* ``allreduce``: an extra all-reduce of a scalar in the model's forward.

docs/lab/work-counts.md has what it printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

FACTORY = """

def adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, foreach=True)
"""
FAULTS = {
    "item": (
        "        return x + self.mlp(self.norm(x))",
        "        x.sum().item()\n        return x + self.mlp(self.norm(x))",
    ),
    "foreach": ("foreach=True", "foreach=False"),
    "allreduce": (
        "        return x + self.mlp(self.norm(x))",
        "        torch.distributed.all_reduce(x.detach().sum())\n        return x + self.mlp(self.norm(x))",
    ),
}


def run(repo: Path, *args: str) -> dict:
    out = repo / "gate.json"
    argv = [sys.executable, "-m", "pytest", "bench_tests", "-q", "-p", "no:cacheprovider", "--perf-op-profiles=off"]
    subprocess.run([*argv, f"--perf-json={out}", "--perf-allow-unjudged", *args], cwd=repo, capture_output=True)
    return json.loads(out.read_text())["results"][0]


def main(repo: Path, runs: int) -> None:
    repo.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "perfsuite", "init"], cwd=repo, check=True, capture_output=True)
    model = repo / "perf_models" / "example.py"
    model.write_text(model.read_text() + FACTORY)
    bench = next((repo / "bench_tests").glob("test_*.py"))
    text = bench.read_text().replace(
        'strategy="ddp",', 'strategy="ddp", strategy_options={"optimizer": "perf_models.example:adamw"},'
    )
    bench.write_text(text)
    recorded = run(repo, "--perf-update-baselines")
    print(
        f"recorded: {recorded['verdict']}, work {recorded['work']['count'] and sum(recorded['work']['count']['ops'].values())} calls"
    )
    clean = model.read_text()
    for fault in ("none", *FAULTS):
        if fault != "none":
            old, new = FAULTS[fault]
            assert old in clean, fault
            model.write_text(clean.replace(old, new))
        verdicts: Counter[str] = Counter()
        for i in range(runs):
            result = run(repo)
            verdicts[result["verdict"]] += 1
            print(f"{fault} {i + 1}: {result['verdict']}: {result['work']['message'][:150]}", flush=True)
        print(f"== {fault}: {dict(verdicts)}", flush=True)
        model.write_text(clean)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
