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
from perfsuite.judge.explain import Explanation

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
    _check_shapes(path, "", document, TOP_SHAPES, hint)
    if document.get("coverage") and not {"line", "ok"} <= document["coverage"].keys():
        raise ReportInputError(f"{path}: 'coverage' lacks its 'line' or 'ok'; {hint}")
    for i, result in enumerate(document["results"]):
        if not isinstance(result, dict) or not all(isinstance(result.get(k), str) for k in ("id", "status", "verdict")):
            raise ReportInputError(f"{path}: results[{i}] lacks 'id', 'status' or 'verdict'; {hint}")
        where = f"results[{i}] ({result['id']}): "
        _check_shapes(path, where, result, RESULT_SHAPES, hint)
        _check_shapes(path, f"{where}metrics.", result.get("metrics") or {}, METRIC_SHAPES, hint)
        if result.get("op_profile"):
            try:
                Explanation.from_json(result["op_profile"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ReportInputError(f"{path}: {where}'op_profile' cannot be read ({exc!r}); {hint}") from None
    return document


#: What the views read from a results file, by field: an object, or a list of objects or numbers.
#: Absent or null fields are fine (older files, results that measured nothing).
Shape = tuple[type, type | None]
TOP_SHAPES: Mapping[str, Shape] = {
    "machine": (dict, None),
    "coverage": (dict, None),
    "relations": (list, dict),
    "ranking": (dict, dict),
    "ceilings": (dict, dict),
    "nodeids": (dict, None),
    "false_alarms": (dict, None),
}
RESULT_SHAPES: Mapping[str, Shape] = {
    "metrics": (dict, None),
    "config": (dict, None),
    "baseline": (dict, None),
    "checks": (list, dict),
    "op_profile": (dict, None),
    "attempts": (list, dict),
    "launch": (dict, None),
    "failure": (dict, None),
    "stack_changes": (list, None),
    "work": (dict, None),
    "repro": (dict, None),
}
METRIC_SHAPES: Mapping[str, Shape] = {
    "per_rank": (list, dict),
    "repeats": (list, dict),
    "health": (list, dict),
    "step_times_s": (list, float),
    "warmup_times_s": (list, float),
    "step_time_s": (dict, None),
    "contention": (dict, None),
}
_NAMES: Mapping[type, str] = {dict: "an object", list: "a list"}
_HELD: Mapping[type, str] = {dict: "objects", float: "numbers"}


def _check_shapes(path: Path, where: str, node: Mapping[str, Any], shapes: Mapping[str, Shape], hint: str) -> None:
    for name, (outer, inner) in shapes.items():
        value = node.get(name)
        if value is None:
            continue
        items = value.values() if isinstance(value, dict) else value
        if not isinstance(value, outer) or (inner is not None and not all(_is(x, inner) for x in items)):
            held = f" of {_HELD[inner]}" if inner is not None else ""
            raise ReportInputError(f"{path}: {where}{name!r} is not {_NAMES[outer]}{held}; {hint}")


def _is(value: Any, kind: type) -> bool:
    return number(value) is not None if kind is float else isinstance(value, kind)


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
