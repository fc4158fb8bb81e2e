"""History store: every run's results document with the commit it measured.

``--perf-history DIR`` keeps one file per run per profile,
``DIR/<profile>/<UTC time>_<short commit>.json``: the results document
(``--perf-json``'s) plus ``commit``, ``commit_time``, ``dirty``, ``branch`` and
``recorded_at``. One file per run means concurrent CI jobs never write the
same file and a bad file spoils one run, not the history.

The typed API (:func:`load`, :func:`series`, :func:`change_points`) is what
``python -m perfsuite history`` and the HTML report read the store with; a change point names the
environment change it coincides with (the documents' fingerprints).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from perfsuite.core.files import atomic_write_json, output_problem
from perfsuite.launch.fingerprint import stack_changes
from perfsuite.reports.exports.changepoint import e_divisive
from perfsuite.store.vcs import Commit, current_commit

FLAG = "--perf-history"
#: Keys a history file adds to the results document.
RUN_KEYS = ("commit", "commit_time", "dirty", "branch", "recorded_at")
#: Fewest runs on either side of a change point (a segment's spread needs a few).
MIN_SEGMENT = 3


class HistoryError(ValueError):
    """A history folder or file that cannot be read; the message names it."""


@dataclass(frozen=True)
class HistoryRun:
    """One recorded run of one profile."""

    path: Path
    profile: str
    commit: str | None  # full hash; None when the run was not in a git checkout
    commit_time: str | None  # ISO 8601
    dirty: bool  # measured with uncommitted changes
    recorded_at: str  # ISO 8601, UTC
    document: Mapping[str, Any]  # the results document, as --perf-json writes it

    def result(self, scenario_id: str) -> Mapping[str, Any] | None:
        return next((r for r in self.document.get("results", []) if r.get("id") == scenario_id), None)

    @property
    def scenario_ids(self) -> list[str]:
        return [str(r.get("id")) for r in self.document.get("results", [])]


@dataclass(frozen=True)
class Point:
    """A metric's value in one run."""

    commit: str | None
    recorded_at: str
    value: float
    std: float | None  # spread over the run's steps, for metrics kept with it
    machine: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The run's fingerprint (its document's ``machine``): Python, driver, CUDA, packages, runtime."""


@dataclass(frozen=True)
class ChangePoint:
    """Where a series shifted: ``points[index]`` is the first run after the change."""

    index: int
    commit: str | None
    before_mean: float  # mean of the segment before (back to the previous change point)
    after_mean: float  # mean of the segment after (up to the next change point)
    rel_change: float  # after / before - 1
    p_value: float  # permutation test of the split
    environment: tuple[str, ...] = ()
    """What changed in the environment between the last run before and the first after (``torch
    2.12.0 -> 2.13.0``): a shift that coincides with one may be the stack's, not the code's."""

    def label(self) -> str:
        """The environment change it coincides with, for a line that names the shift."""
        return f"; the environment changed there: {', '.join(self.environment)}" if self.environment else ""


def environment_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What differs between two runs' fingerprints that a stack upgrade moves: Python, then the
    cards, driver, CUDA and the tracked packages and runtime libraries (:func:`stack_changes`).
    Nothing where either run recorded no fingerprint."""
    if not before or not after:
        return []
    python = (
        [f"Python {before.get('python')} -> {after.get('python')}"]
        if before.get("python") != after.get("python")
        else []
    )
    return python + stack_changes(before, after)


# -- writing ------------------------------------------------------------------
def record(directory: Path, document: Mapping[str, Any], commit: Commit, now: datetime | None = None) -> Path:
    """Store ``document`` as one run of its profile; returns the new file."""
    now = now or datetime.now(timezone.utc)
    profile = str(document.get("profile") or "default")
    name = f"{now.strftime('%Y%m%dT%H%M%S%fZ')}_{commit.short or 'nocommit'}.json"
    path = directory / _slug(profile) / name
    atomic_write_json(
        path,
        {
            **document,
            "commit": commit.id,
            "commit_time": commit.time,
            "dirty": commit.dirty,
            "branch": commit.branch,
            "recorded_at": now.isoformat(),
        },
    )
    return path


def _slug(name: str) -> str:
    """A profile name as a folder name (names like ``cuda-32gb`` pass unchanged)."""
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name) or "default"


# -- reading ------------------------------------------------------------------
def load(dir: Path, profile: str | None = None) -> list[HistoryRun]:
    """Every run stored in ``dir`` (of ``profile`` only, if given), sorted by
    commit time then recording time. Raises :class:`HistoryError` naming the
    folder or file that is missing, empty or malformed."""
    if not dir.is_dir():
        raise HistoryError(f"history folder {dir} does not exist (record runs with pytest {FLAG}={dir})")
    folders = [dir / _slug(profile)] if profile else sorted(p for p in dir.iterdir() if p.is_dir())
    files = sorted(f for folder in folders if folder.is_dir() for f in folder.glob("*.json"))
    if not files:
        where = f"profile {profile!r} in {dir}" if profile else str(dir)
        raise HistoryError(f"no history files for {where} (record runs with pytest {FLAG}={dir})")
    runs = [_read(path) for path in files]
    return sorted(runs, key=_order)


def _read(path: Path) -> HistoryRun:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HistoryError(f"history file {path} cannot be read ({exc}); fix or delete it") from None
    if not isinstance(doc, dict):
        raise HistoryError(f"history file {path} holds no JSON object; fix or delete it")
    if not isinstance(doc.get("results"), list):
        raise HistoryError(f"history file {path} has no 'results' list; fix or delete it")
    recorded_at = doc.get("recorded_at")
    _check_time(path, "recorded_at", recorded_at, required=True)
    _check_time(path, "commit_time", doc.get("commit_time"), required=False)
    return HistoryRun(
        path=path,
        profile=str(doc.get("profile") or path.parent.name),
        commit=doc.get("commit"),
        commit_time=doc.get("commit_time"),
        dirty=bool(doc.get("dirty")),
        recorded_at=str(recorded_at),
        document={k: v for k, v in doc.items() if k not in RUN_KEYS},
    )


def _check_time(path: Path, field: str, value: Any, required: bool) -> None:
    if value is None and not required:
        return
    try:
        datetime.fromisoformat(str(value))
    except ValueError:
        raise HistoryError(
            f"history file {path}: field {field!r} must be an ISO 8601 time, got {value!r}; fix or delete it"
        ) from None


def _order(run: HistoryRun) -> tuple[float, float]:
    """Commit time, then recording time; a run outside git sorts by when it was recorded."""
    recorded = _timestamp(run.recorded_at)
    return (_timestamp(run.commit_time) if run.commit_time else recorded, recorded)


def _timestamp(iso: str) -> float:
    moment = datetime.fromisoformat(iso)
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def series(runs: Sequence[HistoryRun], scenario_id: str, metric: str) -> list[Point]:
    """``metric`` of ``scenario_id`` in every run that measured it, in run order.

    ``metric`` names a key of the result's ``metrics`` (``samples_per_s``,
    ``peak_mem_mib``, ...); a dotted path reaches nested ones
    (``step_time_s.median``, ``extra.mfu``).
    """
    points = []
    for run in runs:
        result = run.result(scenario_id)
        found = _lookup(result.get("metrics") or {}, metric) if result else None
        if found is not None:
            machine = run.document.get("machine")
            points.append(Point(run.commit, run.recorded_at, *found, machine if isinstance(machine, Mapping) else {}))
    return points


def _lookup(metrics: Mapping[str, Any], metric: str) -> tuple[float, float | None] | None:
    node: Any = metrics.get(metric)  # registered names may hold dots themselves (model_state.params)
    if node is None:
        node = metrics
        for part in metric.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, Mapping) and _number(node.get("mean")):
        return float(node["mean"]), float(node["std"]) if _number(node.get("std")) else None
    return (float(node), None) if _number(node) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def change_points(
    points: Sequence[Point], *, max_p: float = 0.01, permutations: int = 499, min_size: int = MIN_SEGMENT
) -> list[ChangePoint]:
    """Where the series shifted, by e-divisive means (:mod:`perfsuite.reports.exports.changepoint`)."""
    values = [p.value for p in points]
    splits = e_divisive(values, max_p=max_p, permutations=permutations, min_size=min_size)
    edges = [0, *(s.index for s in splits), len(values)]
    found = []
    for i, split in enumerate(splits, start=1):
        before = statistics.fmean(values[edges[i - 1] : edges[i]])
        after = statistics.fmean(values[edges[i] : edges[i + 1]])
        rel = after / before - 1 if before else math.nan
        moved = tuple(environment_changes(points[split.index - 1].machine, points[split.index].machine))
        found.append(ChangePoint(split.index, points[split.index].commit, before, after, rel, split.p_value, moved))
    return found


# -- pytest plugin ------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("perfsuite").addoption(
        FLAG,
        metavar="DIR",
        help="append this run's results, with the git commit, to the history in DIR "
        "(one file per run under DIR/<profile>/); see 'python -m perfsuite history'",
    )


def pytest_configure(config: pytest.Config) -> None:
    where = config.getoption(FLAG)
    if where is not None and (not where or (Path(where).exists() and not Path(where).is_dir())):
        raise pytest.UsageError(f"{FLAG} must name a folder (it is created if missing), got {where!r}")
    problem = output_problem(FLAG, where, folder=True)
    if problem:
        raise pytest.UsageError(problem)


def pytest_perfsuite_session_finished(config: pytest.Config, document: dict[str, Any]) -> None:
    where = config.getoption(FLAG)
    if where is None:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not any(r.get("status") in ("ok", "oom") for r in document.get("results", [])):
        # A run that measured nothing (a -k typo, every scenario skipped) is no point of the history.
        if reporter is not None:
            reporter.write_line(f"perfsuite history: nothing was measured, nothing recorded in {where}")
        return
    try:
        path = record(Path(where), document, current_commit(config.rootpath))
    except OSError as exc:
        raise pytest.UsageError(f"{FLAG}: cannot write the history in {where}: {exc}") from None
    if reporter is not None:
        reporter.write_line(f"perfsuite history: recorded {path}")
