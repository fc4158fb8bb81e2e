"""``python -m perfsuite ab-rev REV``: is this checkout slower than revision REV?

An interleaved A/B of two revisions of one repository on one machine, for machines whose
speed drifts between sessions more than any stored baseline's tolerance can absorb (the
2-core cpu VM: 15-40%, and no same-session reference followed it; docs/lab/issue-26.md).
REV's tree is exported (``git archive``) into a scratch folder, then the selected scenarios
run alternately there and here, base first, ``--pairs`` times: every run is a whole pytest
process of that side's own code (its bench_tests, and its perfsuite when the repository holds
one), with an empty baselines folder, so nothing is judged or written, only measured. The
candidate's per-run throughput against the base's run beside it is compared with the paired
test of ``--perf-ab`` (:func:`perfsuite.judge.abtest.run_ab`): drift hits both sides alike. A
regression measured under contention is unreliable. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from perfsuite.commands.cliargs import at_least, probability

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli dependency on 3.10
    import tomli as tomllib
from perfsuite.judge.abtest import REV_TOLERANCE as DEFAULT_TOLERANCE
from perfsuite.judge.abtest import ABResult, run_ab, summary_lines
from perfsuite.judge.contention import Contention, contended
from perfsuite.launch import warm
from perfsuite.spec.profiles import CPU

BASE, CANDIDATE = "base", "candidate"
#: The headline metric the A/B judges; memory and exact bytes stay with the stored-baseline gate.
METRIC = "samples_per_s"
#: A launch is (status, metrics, message, why it was contended).
Launch = tuple[str, dict[str, float], str, str]


def export(repo: Path, rev: str, into: Path) -> str:
    """REV's tree under ``into`` (``git archive``: no worktree left behind); its full commit."""
    commit = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as raw:
        raw.write(archive)
        raw.seek(0)
        with tarfile.open(fileobj=raw) as tar:
            tar.extractall(into, filter="data")
    return commit


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def run_side(root: Path, paths: Sequence[str], pytest_args: Sequence[str], out: Path) -> dict[str, Launch]:
    """One pytest run of the selected scenarios in ``root`` (that side's code first on the path),
    against an empty baselines folder: each scenario's launch, by id."""
    empty = out.with_suffix(".baselines")
    empty.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pytest", *paths, "-p", "no:cacheprovider", *own_plugin(root), "-q",
            f"--perf-baselines={empty}", f"--perf-json={out}", *pytest_args]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(root)}
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
    if not out.exists():
        tail = (done.stdout + done.stderr).strip()[-1500:]
        raise RuntimeError(f"pytest in {root} wrote no results (exit {done.returncode}): {tail}")
    return {r["id"]: launch_of(r) for r in json.loads(out.read_text())["results"]}


def own_plugin(root: Path) -> list[str]:
    """pytest arguments that load the side's own plugin where its tree holds perfsuite itself.

    pytest finds the plugin through the installed entry point, which names this checkout's module
    (``perfsuite.plugin.hooks``); a revision from before the folders had ``perfsuite.plugin``, so
    its side would fail to start. Its own ``pyproject.toml`` names the module that its code has."""
    pyproject = root / "pyproject.toml"
    if not (root / "perfsuite" / "__init__.py").is_file() or not pyproject.is_file():
        return []
    try:
        entry = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["pytest11"]["perfsuite"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return []
    return ["-p", "no:perfsuite", "-p", str(entry)]


def launch_of(result: Mapping[str, Any]) -> Launch:
    metrics = result.get("metrics") or {}
    value = metrics.get(METRIC)
    values = {METRIC: float(value["mean"])} if isinstance(value, Mapping) else {}
    status, message = str(result.get("status") or "error"), str(result.get("message") or "")
    if status == "ok" and not values:  # a microbenchmark's or collective's rate is another metric
        status, message = "skipped", f"measures no {METRIC}: ab-rev compares training throughput"
    busy = metrics.get("contention")
    why = contended(Contention(**busy), CPU.max_foreign_cores, CPU.max_steal_cores) if busy else ""
    return status, values, message, why


def compare_runs(runs: Sequence[tuple[str, Mapping[str, Launch]]], pairs: int, tolerance: float) -> list[ABResult]:
    """Each scenario measured on both sides, judged from the runs in the order they ran."""
    by_scenario: dict[str, dict[str, list[Launch]]] = defaultdict(lambda: {BASE: [], CANDIDATE: []})
    for side, launches in runs:
        for scenario_id, launch in launches.items():
            by_scenario[scenario_id][side].append(launch)
    results = []
    for scenario_id, sides in sorted(by_scenario.items()):
        queues: dict[str, Iterator[Launch]] = {side: iter(launches) for side, launches in sides.items()}

        def replay(side: str, queues: dict[str, Iterator[Launch]] = queues) -> Launch:
            return next(queues[side], ("error", {}, f"no {side} run measured it", ""))

        results.append(run_ab(scenario_id, (METRIC,), replay, BASE, CANDIDATE, pairs, {METRIC: tolerance}))
    return results


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("ab-rev", help="interleaved A/B of this checkout against a git revision")
    parser.add_argument("rev", help="the base revision (e.g. HEAD~1, origin/main)")
    parser.add_argument("paths", nargs="*", default=["bench_tests"],
                        help="test paths or node ids, the same on both sides (default bench_tests)")  # fmt: skip
    parser.add_argument("-k", dest="keyword", help="pytest -k expression: the scenarios to compare")
    parser.add_argument("--pairs", type=at_least(2), default=3, help="base/candidate runs, alternating (default 3)")
    parser.add_argument("--tolerance", type=probability, default=DEFAULT_TOLERANCE,
                        help=f"relative loss that fails when significant (default {DEFAULT_TOLERANCE})")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the comparisons to this file")
    parser.add_argument("--candidate-arg", action="append", default=[], metavar="ARG",
                        help="an argument for the candidate's pytest only, e.g. --candidate-arg=--perf-inject-slowdown=20 "
                        "to measure what the A/B detects (repeatable)")  # fmt: skip


def run(ns: argparse.Namespace, extra: Sequence[str]) -> int:
    """0: no regression; 1: a regression; 2: bad input; 3: nothing could be compared (not judged)."""
    here = Path.cwd()
    warm.share_with_children()  # each side's launches fork from that side's parent, every pair
    with tempfile.TemporaryDirectory(prefix="perfsuite-ab-rev.") as scratch:
        base = Path(scratch) / "base"
        try:
            commit = export(here, ns.rev, base)
        except (ValueError, subprocess.CalledProcessError) as exc:
            print(f"perfsuite ab-rev: cannot export {ns.rev!r}: {exc}", file=sys.stderr)
            return 2
        args = [*(["-k", ns.keyword] if ns.keyword else []), *extra]
        sides = ((BASE, base, args), (CANDIDATE, here, [*args, *ns.candidate_arg]))
        runs = []
        for pair in range(ns.pairs):
            for side, root, side_args in sides:
                runs.append((side, run_side(root, ns.paths, side_args, Path(scratch) / f"{side}-{pair}.json")))
    results = compare_runs(runs, ns.pairs, ns.tolerance)
    print(f"perfsuite ab-rev: this checkout against {ns.rev} ({commit[:12]}), {ns.pairs} pairs")
    print("\n".join(summary_lines(results)))
    if ns.json:
        ns.json.write_text(json.dumps({"base": commit, "ab": [r.to_json() for r in results]}, indent=1))
    judged = [r for r in results if r.verdict in ("pass", "regression")]
    if any(r.verdict == "regression" for r in results):
        return 1
    if not judged:
        print("perfsuite ab-rev: nothing was judged (not measured on both sides, or contended)", file=sys.stderr)
        return 3
    return 0
