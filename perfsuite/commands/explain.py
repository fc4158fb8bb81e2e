"""``python -m perfsuite explain RESULTS.json``: why each regressed scenario of a results
file got slower, from the op profiles the run saved (:mod:`perfsuite.judge.explain`);
with ``--launch``, where each result's launch spent its time (``launch.timeline``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsuite.core.opprofile import TABLE_COLUMNS
from perfsuite.core.protocol import LAUNCH_STRETCHES
from perfsuite.core.text import table
from perfsuite.judge.explain import Explanation
from perfsuite.reports.html.results import ReportInputError, load_results

#: Columns of a launch's breakdown.
LAUNCH_COLUMNS = ("until", "what", "at s", "took s", "of wall")
_STRETCHES: dict[str, str] = {str(mark): what for mark, what in LAUNCH_STRETCHES.items()}


def add_parser(commands: Any) -> None:
    explain = commands.add_parser(
        "explain",
        help="print why each regressed scenario of a results file got slower (--launch: where launches spent their time)",
    )
    explain.add_argument("results", type=Path, help="results file (pytest --perf-json FILE)")
    explain.add_argument("--rows", type=int, default=10, help="ops per diff table (default 10)")
    explain.add_argument(
        "--launch",
        action="store_true",
        help="instead: each result's launch timeline (agent, imports, CUDA, process group, build, warmup, steps, "
        "exit) and its overhead, its wall time less its timed warmup and measured steps",
    )


def run(ns: argparse.Namespace) -> int:
    """0 when something was explained, 1 when the file holds no explanation, 2 for bad input."""
    try:
        document = load_results(ns.results)
    except ReportInputError as exc:
        print(f"perfsuite explain: {exc}", file=sys.stderr)
        return 2
    if ns.launch:
        return print_launches(document, ns.results)
    explained = [r for r in document["results"] if r.get("op_profile")]
    for result in explained:
        print(f"{result['id']}: {result['verdict']}")
        for line in lines(Explanation.from_json(result["op_profile"]), ns.rows):
            print(f"  {line}")
    if not explained:
        print(f"perfsuite explain: {ns.results} has no op profile: no scenario regressed in that run")
        return 1
    return 0


def lines(explanation: Explanation, rows: int = 10) -> list[str]:
    """The lead, the diff table (none without a stored profile) and the footer."""
    found = explanation.diff()
    body = table(TABLE_COLUMNS, found.table(rows)) if found is not None else []
    return [explanation.lead(), *body, explanation.footer()]


def print_launches(document: Mapping[str, Any], path: Path) -> int:
    timed = [r for r in document["results"] if (r.get("launch") or {}).get("timeline")]
    for result in timed:
        print("\n".join(launch_lines(result)))
    if not timed:
        print(f"perfsuite explain: {path} has no launch timeline (written by perfsuite before it kept one?)")
        return 1
    return 0


def launch_lines(result: Mapping[str, Any]) -> list[str]:
    """A result's launch timeline as a table: each stretch, when it ended, how long it took and
    its share of the wall time; then the overhead (wall less the timed warmup and steps)."""
    launch = result["launch"]
    timeline: list[tuple[str, float]] = [(str(name), float(at)) for name, at in launch["timeline"]]
    wall = float(result.get("wall_s") or timeline[-1][1])
    rows, before = [], 0.0
    for name, at in timeline:
        if name == "spawn":
            continue
        took, before = at - before, at
        share = f"{took / wall:.0%}" if wall else "-"
        rows.append((name, _STRETCHES.get(name, name), f"{at:.2f}", f"{took:.2f}", share))
    head = f"{result['id']}: {result['status']}, wall {wall:.2f} s, ranks started by {launch.get('rank_start') or '?'}"
    overhead = launch.get("overhead_s")
    tail = (
        f"overhead {overhead:.2f} s ({overhead / wall:.0%} of wall): wall less the timed warmup and measured steps"
        if overhead is not None and wall
        else "overhead: unknown (no rank 0 report)"
    )
    return [head, *(f"  {line}" for line in table(LAUNCH_COLUMNS, rows)), f"  {tail}", *start_lines(launch)]


def start_lines(launch: Mapping[str, Any]) -> list[str]:
    """What a warm parent saved the launch (the imports it had paid, once per run), or why the
    launch did not start as asked."""
    lines = []
    parent = launch.get("warm")
    if parent:
        modules = ", ".join(["torch", "torchrun", *parent.get("preloaded", [])])
        paid = (
            "this launch started the parent and waited for them"
            if parent.get("started_for_this_launch")
            else "paid before this launch"
        )
        lines.append(
            f"  warm parent (pid {parent['parent_pid']}): {parent['imports_s']:.2f} s of imports ({modules}) "
            f"paid once for the run, not by this launch's agent and ranks ({paid})"
        )
    if launch.get("rank_start_note"):
        lines.append(f"  not started as asked: {launch['rank_start_note']}")
    return lines
