"""GitHub Actions annotations: inside a job (``GITHUB_ACTIONS=true``) every pytest session
that ran perfsuite scenarios prints one workflow command per scenario that failed the gate
(``::error``), could not be judged (``::warning``: unreliable, no baseline) or was judged only in part (``::notice``: timing from another processor), and per
violated relation. GitHub shows them on the run and on the pull request's checks, so a
regression is visible without opening the log or the HTML report.

It only reads the results document handed to ``pytest_perfsuite_session_finished``: what is
measured and judged is the same with or without it, and outside GitHub Actions it prints
nothing. A pytest plugin of its own, like the other exporters.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from perfsuite.judge.compare import FAILING
from perfsuite.judge.coverage import TIMING_ELSEWHERE, UNJUDGED

#: The variable GitHub's runner sets in every job.
ENV = "GITHUB_ACTIONS"


def pytest_perfsuite_session_finished(config: pytest.Config, document: dict[str, Any]) -> None:
    if os.environ.get(ENV) != "true":
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in workflow_commands(document):
        # Workflow commands must start a line of the step's output.
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)


def workflow_commands(document: Mapping[str, Any]) -> Iterator[str]:
    """GitHub workflow commands for the results document's failures and unjudged scenarios."""
    profile = document.get("profile", "?")
    for result in document.get("results", []):
        level = _level(result["verdict"])
        if level is not None:
            title = f"perfsuite {profile}: {result['id']} {result['verdict']}"
            yield f"::{level} title={_property(title)}::{_data(str(result.get('message', '')))}"
    for relation in document.get("relations", []):
        if relation.get("status") == "violated":
            title = f"perfsuite {profile}: relation {relation.get('id')} violated"
            yield f"::error title={_property(title)}::{_data(str(relation.get('message', '')))}"


def _level(verdict: str) -> str | None:
    if verdict in FAILING:
        return "error"
    if verdict in UNJUDGED:
        return "warning"
    return "notice" if verdict == TIMING_ELSEWHERE else None


def _data(text: str) -> str:
    """Escaped as GitHub's runner expects for a command's message (multi-line messages stay whole)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")
