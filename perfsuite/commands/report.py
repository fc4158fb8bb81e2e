"""``python -m perfsuite report`` and ``summary``: a results file as an HTML
page, or as a table (plain or markdown)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from perfsuite.reports.html import summary
from perfsuite.reports.html.results import ReportInputError, load_results

COMMANDS = ("report", "summary")
INSTALL = "pip install 'perfsuite[report]' (or make setup, whose test extra has them)"


def add_parsers(commands: Any) -> None:
    """The ``report`` and ``summary`` subcommands on perfsuite's argparse subparsers."""
    report = commands.add_parser("report", help="write a results file as one self-contained HTML page with plots")
    report.add_argument("results", type=Path, help="results file (pytest --perf-json FILE)")
    report.add_argument(
        "-o", "--output", type=Path, default=Path("perf-report.html"), help="page to write (default perf-report.html)"
    )
    report.add_argument(
        "--history",
        type=Path,
        metavar="DIR",
        help="add trend charts from this history folder (pytest --perf-history DIR)",
    )
    table = commands.add_parser("summary", help="print a results file's summary table")
    table.add_argument("results", type=Path, help="results file (pytest --perf-json FILE)")
    table.add_argument("--markdown", action="store_true", help="as markdown, e.g. >> $GITHUB_STEP_SUMMARY")
    table.add_argument(
        "--event",
        type=Path,
        metavar="FILE",
        help="as the pull-request comment for this GitHub event payload ($GITHUB_EVENT_PATH): the markdown "
        "under a marker the workflow finds it by, the run's link and each failed row's commands",
    )
    table.add_argument(
        "--head",
        metavar="SHA",
        help="with --event: the commit the run judged (default: the pull request's head in the event, "
        "which a comment's payload does not name)",
    )
    table.add_argument(
        "--append",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="with --event: markdown to add at the end, e.g. ab-rev --markdown's table (a missing file is left out)",
    )


def run(ns: argparse.Namespace) -> int:
    """Exit 0 when written, 2 for bad input (a one-line message naming it); unknown
    arguments never reach here (``perfsuite.__main__`` refuses them)."""
    try:
        document = load_results(ns.results)
    except ReportInputError as exc:
        return _fail(ns.command, str(exc))
    if ns.command == "summary" and ns.event is not None:
        return _comment(ns, document)
    if ns.command == "summary":
        sys.stdout.write(summary.markdown(document) if ns.markdown else summary.text(document))
        return 0
    return _report(ns, document)


def _comment(ns: argparse.Namespace, document: dict[str, Any]) -> int:
    from perfsuite.reports.html import comment

    try:
        pr = comment.read_event(ns.event)
    except comment.EventError as exc:
        return _fail("summary", str(exc))
    if ns.head:
        pr = dataclasses.replace(pr, head_sha=ns.head)
    appended = [path.read_text(encoding="utf-8") for path in ns.append if path.is_file()]
    sys.stdout.write(comment.comment(document, pr, comment.run_url(os.environ), appended))
    return 0


def _report(ns: argparse.Namespace, document: dict[str, Any]) -> int:
    try:
        from perfsuite.reports.html import page
    except ImportError as exc:  # matplotlib or jinja2: the report extra
        return _fail("report", f"needs matplotlib and jinja2 ({exc}); install them: {INSTALL}")
    if ns.history is not None and not ns.history.is_dir():
        return _fail("report", f"--history {ns.history}: no such folder; give the folder pytest --perf-history wrote")
    from perfsuite.reports.exports.history import HistoryError

    try:
        html = page.render(document, str(ns.results), ns.history)
    except HistoryError as exc:
        return _fail("report", f"--history: {exc}")
    try:
        page.write(ns.output, html)
    except OSError as exc:
        return _fail("report", f"cannot write {ns.output}: {exc}")
    print(f"perfsuite report: wrote {ns.output} ({len(document['results'])} scenarios)")
    return 0


def _fail(command: str, message: str) -> int:
    print(f"perfsuite {command}: {message}", file=sys.stderr)
    return 2
