"""``python -m perfsuite explain RESULTS.json``: why each regressed scenario of a results
file got slower, from the op profiles the run saved (:mod:`perfsuite.judge.explain`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from perfsuite.judge.explain import Explanation
from perfsuite.reports.html.results import ReportInputError, load_results
from perfsuite.spec.opprofile import TABLE_COLUMNS
from perfsuite.spec.text import table


def add_parser(commands: Any) -> None:
    explain = commands.add_parser("explain", help="print why each regressed scenario of a results file got slower")
    explain.add_argument("results", type=Path, help="results file (pytest --perf-json FILE)")
    explain.add_argument("--rows", type=int, default=10, help="ops per diff table (default 10)")


def run(ns: argparse.Namespace) -> int:
    """0 when something was explained, 1 when the file holds no explanation, 2 for bad input."""
    try:
        document = load_results(ns.results)
    except ReportInputError as exc:
        print(f"perfsuite explain: {exc}", file=sys.stderr)
        return 2
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
