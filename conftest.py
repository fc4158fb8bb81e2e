"""This repository's own pytest setup: GitHub Actions annotations for benchmark runs.

Inside a GitHub Actions job (``GITHUB_ACTIONS=true``), every pytest session in
this repository that ran perfsuite scenarios (``make bench``, ``make test``'s cpu
gate, the workflows in ``.github/workflows``) prints one workflow command per
scenario that failed the gate (``::error``) or could not be judged
(``::warning``: unreliable, no baseline), and per violated relation. GitHub
shows them as annotations on the run and on the pull request's checks, so a
regression is visible without opening the log or the HTML report.

It only reads the results document perfsuite hands to
``pytest_perfsuite_session_finished``: what is measured and judged is the same
with or without it, and outside GitHub Actions it prints nothing. pytester
projects in temporary folders (the self-tests) are outside this folder and do
not load it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from perfsuite.compare import FAILING

#: Verdicts that pass the gate but leave a scenario unjudged.
UNJUDGED = frozenset({"unreliable", "no_baseline"})
#: Verdicts that pass having judged only part of a scenario (its timing came from another processor).
PARTLY_JUDGED = frozenset({"other_machine"})


@pytest.hookimpl(optionalhook=True)  # a session with `-p no:perfsuite` has no such hook
def pytest_perfsuite_session_finished(config: pytest.Config, document: dict[str, Any]) -> None:
    if os.environ.get("GITHUB_ACTIONS") != "true":
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
        verdict = result["verdict"]
        level = "error" if verdict in FAILING else "warning" if verdict in UNJUDGED else None
        level = level or ("notice" if verdict in PARTLY_JUDGED else None)
        if level is not None:
            title = f"perfsuite {profile}: {result['id']} {result['verdict']}"
            yield f"::{level} title={_property(title)}::{_data(str(result.get('message', '')))}"
    for relation in document.get("relations", []):
        if relation.get("status") == "violated":
            title = f"perfsuite {profile}: relation {relation.get('id')} violated"
            yield f"::error title={_property(title)}::{_data(str(relation.get('message', '')))}"


def _data(text: str) -> str:
    """Escaped as GitHub's runner expects for a command's message (multi-line messages stay whole)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")
