"""A results file as the report reads it: loading, checking, and the figures
every view of a scenario shows."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core.workloads import BaseScenario
from perfsuite.judge.compare import FAILING

Result = Mapping[str, Any]

#: How each verdict is shown: ``bad`` for the verdicts that fail the run.
VERDICT_STYLE: Mapping[str, str] = {
    "pass": "good",
    "improved": "good",
    "recorded": "good",
    "expected_oom": "good",
    **dict.fromkeys(FAILING, "bad"),
    "unreliable": "warn",
    "no_baseline": "warn",
    "other_machine": "muted",
    "skipped": "muted",
}

#: Relation outcomes (perfsuite.core.relations.RelationOutcome.status).
RELATION_STYLE: Mapping[str, str] = {"holds": "good", "violated": "bad", "skipped": "muted"}


class ReportInputError(Exception):
    """The file is missing or not a perfsuite results file; the message names it."""


def load_results(path: Path) -> dict[str, Any]:
    """The results document in ``path``, checked enough that every view can read it."""
    hint = "give the file `pytest --perf-json FILE` wrote"
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportInputError(f"{path}: no such file; {hint}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"{path}: cannot read it ({exc}); {hint}") from None
    except json.JSONDecodeError as exc:
        raise ReportInputError(f"{path}: not JSON ({exc}); {hint}") from None
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ReportInputError(f"{path}: not a perfsuite results file (no 'results' list); {hint}")
    if not isinstance(document.get("profile"), str):
        raise ReportInputError(f"{path}: not a perfsuite results file (no 'profile' name); {hint}")
    for i, result in enumerate(document["results"]):
        if not isinstance(result, dict) or not all(isinstance(result.get(k), str) for k in ("id", "status", "verdict")):
            raise ReportInputError(f"{path}: results[{i}] lacks 'id', 'status' or 'verdict'; {hint}")
        if not isinstance(result.get("metrics") or {}, dict):
            raise ReportInputError(f"{path}: results[{i}] ({result['id']}): 'metrics' is not an object; {hint}")
    return document


def primary_metric(result: Result) -> str | None:
    """The metric the scenario's kind is judged by first: the config's
    ``primary`` when the file names it, else its kind's (a kind declared
    outside perfsuite: its first check's metric)."""
    config = result.get("config") or {}
    named = config.get("primary") or _primaries().get(str(config.get("kind")))
    if isinstance(named, str):
        return named
    return next((c.get("metric") for c in result.get("checks") or [] if c.get("metric") in registry.METRICS), None)


def _primaries() -> dict[str, str]:
    """Primary metric by workload kind, from the kinds' own declarations."""
    found: dict[str, str] = {}
    todo: list[type[BaseScenario]] = [BaseScenario]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(getattr(cls, "kind", None), str) and isinstance(getattr(cls, "primary", None), str):
            found.setdefault(cls.kind, cls.primary)
    return found


def number(node: Any) -> float | None:
    """``node`` as a float when the file holds a finite number there (JSON's true is not one)."""
    if isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
        return float(node)
    return None


def value(metrics: Mapping[str, Any] | None, name: str) -> float | None:
    """A metric's number (a spread's mean), or None where it was not measured."""
    node = (metrics or {}).get(name)
    return number(node.get("mean") if isinstance(node, Mapping) else node)


def spread(metrics: Mapping[str, Any] | None, name: str) -> float | None:
    node = (metrics or {}).get(name)
    return number(node.get("std") if isinstance(node, Mapping) else None)


def check(result: Result, name: str | None) -> Mapping[str, Any] | None:
    """The baseline comparison of metric ``name``, when there was one."""
    return next((c for c in result.get("checks") or [] if c.get("metric") == name), None)


def unit(name: str) -> str:
    return registry.get(name).unit if name in registry.METRICS else ""


def reference(result: Result) -> str:
    """The published (seed) figure the scenario reproduces, as its ``reference=`` says."""
    text = (result.get("config") or {}).get("reference")
    return text if isinstance(text, str) else ""


def style(verdict: str) -> str:
    return VERDICT_STYLE.get(verdict, "warn")


def relation_style(status: str) -> str:
    return RELATION_STYLE.get(status, "warn")


def counts(document: Mapping[str, Any]) -> dict[str, int]:
    """How many scenarios got each verdict, most common first."""
    found: dict[str, int] = {}
    for result in document["results"]:
        found[result["verdict"]] = found.get(result["verdict"], 0) + 1
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def headline(document: Mapping[str, Any]) -> str:
    """e.g. ``profile cpu: 3 pass, 1 regression``."""
    parts = ", ".join(f"{n} {verdict}" for verdict, n in counts(document).items()) or "no scenarios"
    return f"profile {document['profile']}: {parts}"
