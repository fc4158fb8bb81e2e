"""``python -m perfsuite history DIR``: each scenario's metric over the
recorded runs, and the commits where it shifted (e-divisive means).

``--publish BRANCH`` appends DIR's runs to the fleet's history on a branch of the repository,
``--branch BRANCH`` reads that history into DIR first (:mod:`perfsuite.reports.exports.shared`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfsuite.commands.cliargs import probability
from perfsuite.reports.exports import shared
from perfsuite.reports.exports.history import MIN_SEGMENT, HistoryError, HistoryRun, Point, change_points, load, series


def add_parser(commands: Any) -> None:
    """The ``history`` subcommand on perfsuite's argparse subparsers."""
    history = commands.add_parser("history", help="a scenario's metric over commits and where it shifted")
    history.add_argument("dir", type=Path, help="history folder (pytest --perf-history=DIR)")
    shared = history.add_mutually_exclusive_group()
    shared.add_argument(
        "--publish",
        metavar="BRANCH",
        help="append DIR's runs to the fleet's history on this branch of --remote and push (retried "
        "when another runner pushed first); pull-request runs should not",
    )
    shared.add_argument(
        "--branch", metavar="BRANCH", help="read the fleet's history from this branch of --remote into DIR first"
    )
    history.add_argument("--remote", default="origin", help="git remote of --publish and --branch (default origin)")
    history.add_argument("--profile", help="only this profile's runs (default: every profile in DIR)")
    history.add_argument("-k", dest="keyword", help="only scenarios whose id contains this text")
    history.add_argument("--metric", default="samples_per_s", help="metric to follow (default samples_per_s)")
    history.add_argument(
        "--max-p", type=probability, default=0.01, help="significance a change point needs (default 0.01)"
    )


def run(ns: argparse.Namespace) -> int:
    if not 0 < ns.max_p < 1:
        print(f"perfsuite history: --max-p must be between 0 and 1, got {ns.max_p}", file=sys.stderr)
        return 2
    try:
        if ns.publish:
            added = shared.publish(ns.dir, Path.cwd(), ns.publish, ns.remote)
            print(f"perfsuite history: {len(added)} run(s) of {ns.dir} appended to {ns.remote}/{ns.publish}")
            return 0
        if ns.branch:
            shared.materialise(Path.cwd(), ns.branch, ns.dir, ns.remote)
        runs = load(ns.dir, ns.profile)
    except (HistoryError, shared.SharedHistoryError) as exc:
        print(f"perfsuite history: {exc}", file=sys.stderr)
        return 2
    shown = 0
    for profile in dict.fromkeys(r.profile for r in runs):
        of_profile = [r for r in runs if r.profile == profile]
        for scenario in scenario_ids(of_profile, ns.keyword):
            points = series(of_profile, scenario, ns.metric)
            if points:
                dates = {r.commit: r.commit_time for r in of_profile if r.commit}
                print("\n".join([*report(profile, scenario, ns.metric, points, ns.max_p, dates), ""]))
                shown += 1
    if not shown:
        which = f" matching -k {ns.keyword!r}" if ns.keyword else ""
        print(f"perfsuite history: no scenario{which} in {ns.dir} has values of {ns.metric!r}", file=sys.stderr)
        return 2
    return 0


def scenario_ids(runs: Sequence[HistoryRun], keyword: str | None) -> list[str]:
    """Every scenario of these runs, in order of first appearance."""
    ids = dict.fromkeys(i for r in runs for i in r.scenario_ids)
    return [i for i in ids if not keyword or keyword in i]


def report(
    profile: str, scenario: str, metric: str, points: Sequence[Point], max_p: float, dates: Mapping[str, str | None]
) -> list[str]:
    """The series as a table (date: the commit's, else when the run was recorded), then its change points."""
    lines = [f"{scenario} ({profile}): {metric} over {len(points)} run(s)", "commit    date              value"]
    for point in points:
        spread = f" ± {point.std:.4g}" if point.std is not None else ""
        when = _when(dates.get(point.commit or "") or point.recorded_at)
        lines.append(f"{_short(point.commit):<9} {when:<17} {point.value:.4g}{spread}")
    if len(points) < 2 * MIN_SEGMENT:
        return [*lines, f"too few runs to look for change points ({len(points)}; needs {2 * MIN_SEGMENT})"]
    found = change_points(points, max_p=max_p)
    for change in found:
        lines.append(
            f"{metric} of {scenario} shifted {change.rel_change:+.1%} at commit {_short(change.commit)} "
            f"(p={change.p_value:.3f}): {change.before_mean:.4g} -> {change.after_mean:.4g}{change.label()}"
        )
    return lines if found else [*lines, f"no change point in {metric} of {scenario} (p <= {max_p:g})"]


def _short(commit: str | None) -> str:
    return commit[:7] if commit else "-"


def _when(iso: str) -> str:
    moment = datetime.fromisoformat(iso)
    return (moment.astimezone(timezone.utc) if moment.tzinfo else moment).strftime("%Y-%m-%d %H:%M")
