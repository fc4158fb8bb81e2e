"""The pull-request comment (issue 57): the job summary's verdicts, the link to the run whose
artifact holds the HTML report, each failed row's commands to run it again and settle it, and the
A/B's table, under a marker by which the workflow finds its own comment and edits it in place, so a
pull request carries one comment that each push brings up to date.

The pull request comes from GitHub's own event payload (``$GITHUB_EVENT_PATH``), the run from the
runner's environment (``GITHUB_SERVER_URL``, ``GITHUB_REPOSITORY``, ``GITHUB_RUN_ID``). Pure but
for :func:`read_event`; torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.judge.repro import Repro
from perfsuite.reports.html import summary

#: The comment's first line: the workflow edits the comment that starts with it, else adds one.
MARKER = "<!-- perfsuite: pull-request comment -->"


class EventError(ValueError):
    """An event payload that names no pull request; the message names the file and the field."""


@dataclass(frozen=True)
class PullRequest:
    """The pull request an event payload is about."""

    number: int
    head_sha: str


def read_event(path: Path) -> PullRequest:
    """The pull request of a ``pull_request`` (or ``pull_request_target``) event payload."""
    try:
        event = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EventError(f"event payload {path} cannot be read ({exc}); pass $GITHUB_EVENT_PATH") from None
    return pull_request(event, str(path))


def pull_request(event: Any, where: str) -> PullRequest:
    """The pull request of a ``pull_request`` event, or of an ``issue_comment`` on a pull request
    (``/perf``), whose payload names no head commit (``head_sha`` empty: the caller knows it)."""
    found = event.get("pull_request") if isinstance(event, Mapping) else None
    issue = event.get("issue") if isinstance(event, Mapping) else None
    if not isinstance(found, Mapping) and isinstance(issue, Mapping) and isinstance(issue.get("pull_request"), Mapping):
        number = issue.get("number")
        if not isinstance(number, int):
            raise EventError(f"event payload {where}: 'issue' needs 'number'")
        return PullRequest(number, "")
    if not isinstance(found, Mapping):
        raise EventError(
            f"event payload {where} has no 'pull_request' (nor an 'issue' that is one): "
            "comment on pull_request events, or on a comment on a pull request, only"
        )
    head = found.get("head")
    number, sha = found.get("number"), head.get("sha") if isinstance(head, Mapping) else None
    if not isinstance(number, int) or not isinstance(sha, str) or not sha:
        raise EventError(f"event payload {where}: 'pull_request' needs 'number' and 'head.sha'")
    return PullRequest(number, sha)


def run_url(env: Mapping[str, str]) -> str | None:
    """This workflow run's page, where its artifact (HTML report, results file) is."""
    parts = [env.get(name, "") for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    return f"{parts[0]}/{parts[1]}/actions/runs/{parts[2]}" if all(parts) else None


def repro_sections(document: Mapping[str, Any]) -> list[str]:
    """Each failed row's commands (its ``repro``), as markdown."""
    lines: list[str] = []
    for result in document.get("results") or []:
        repro = Repro.of(result.get("repro")) if isinstance(result, Mapping) else None
        if repro is None:
            continue
        lines += ["", f"#### Reproduce `{result.get('id', '?')}`", "", "```sh"]
        lines += [line for label, command in repro.labelled() for line in (f"# {label}", command)]
        lines += ["```"]
    return lines


def comment(document: Mapping[str, Any], pr: PullRequest, run: str | None, appended: Sequence[str] = ()) -> str:
    """The comment's markdown: the marker, which commit it judged, the summary, the commands, then
    ``appended`` (the A/B's table that ``ab-rev --markdown`` wrote)."""
    where = f"[the run]({run}): its artifact holds the HTML report" if run else "the run's artifact"
    judged = f"commit {pr.head_sha[:12]}" if pr.head_sha else "this pull request"
    lines = [
        MARKER,
        f"perfsuite judged {judged} of #{pr.number}; details in {where}.",
        "",
        summary.markdown(document).rstrip("\n"),
        *repro_sections(document),
    ]
    for text in appended:
        lines += ["", text.rstrip("\n")]
    return "\n".join(lines) + "\n"
