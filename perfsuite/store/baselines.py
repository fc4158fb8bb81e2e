"""Baseline storage: one JSON file per scenario group under
``baselines/<hardware-profile>/<group>.json``.

Files are written only by ``--perf-update-baselines``, atomically (temp file plus
rename in the same folder), with sorted keys so diffs stay small. Each update
holds a lock on its group file (``<group>.json.lock`` beside it) and merges into
the file as it is on disk then, so concurrent runs recording scenarios of one
group keep every entry. Hand-set keys
(``tolerances``, ``note`` and anything unknown) survive an update; scenarios the
run did not measure are left untouched. A corrupt or schema-invalid file raises
:class:`BaselineError` naming the file and is never rewritten.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from perfsuite.spec.files import atomic_write_json
from perfsuite.spec.metrics import METRICS
from perfsuite.spec.workloads.base import OUTCOMES

SCHEMA_VERSION = 1
LOCK_TIMEOUT_S = 120.0  # a write holds the lock for milliseconds; this long means a stuck process


class BaselineError(Exception):
    """A baseline file cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class BaselineEntry:
    """The stored baseline of one scenario on one profile."""

    expected: str
    metrics: Mapping[str, Any]
    tolerances: Mapping[str, float]
    fingerprint: Mapping[str, Any]
    note: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def value(self, metric: str) -> float | None:
        raw = self.metrics.get(metric)
        if isinstance(raw, Mapping):
            return float(raw["mean"])
        return None if raw is None else float(raw)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "expected": self.expected,
            "metrics": dict(self.metrics),
            "tolerances": dict(self.tolerances),
            "fingerprint": dict(self.fingerprint),
            **({"note": self.note} if self.note else {}),
        }


def _problem(path: Path, where: str, what: str) -> BaselineError:
    return BaselineError(
        f"baseline file {path}: {where} {what}. Fix or delete the entry by hand, or "
        "restore the file from version control; perfsuite will not overwrite it."
    )


def parse_entry(path: Path, key: str, raw: Any) -> BaselineEntry:
    where = f"scenarios[{key!r}]"
    if not isinstance(raw, dict):
        raise _problem(path, where, "must be an object")
    expected = raw.get("expected", "ok")
    if expected not in OUTCOMES:
        raise _problem(path, f"{where}.expected", f"must be one of {OUTCOMES}, got {expected!r}")
    metrics = raw.get("metrics", {})
    if not isinstance(metrics, dict):
        raise _problem(path, f"{where}.metrics", "must be an object")
    for name, value in metrics.items():
        _check_metric(path, f"{where}.metrics.{name}", value)
    tolerances = raw.get("tolerances", {})
    if not isinstance(tolerances, dict):
        raise _problem(path, f"{where}.tolerances", "must be an object")
    for name, tol in tolerances.items():
        if name not in METRICS or not isinstance(tol, (int, float)) or not 0 <= tol < 1:
            raise _problem(
                path,
                f"{where}.tolerances.{name}",
                f"must name a registered metric ({', '.join(m.name for m in METRICS)}) with a value in [0, 1)",
            )
    fingerprint = raw.get("fingerprint") or {}
    if not isinstance(fingerprint, dict):  # an update rewrites it as an object
        raise _problem(path, f"{where}.fingerprint", f"must be an object, got {fingerprint!r}")
    known = {"expected", "metrics", "tolerances", "fingerprint", "note"}
    return BaselineEntry(
        expected=expected,
        metrics=metrics,
        tolerances=tolerances,
        fingerprint=fingerprint,
        note=str(raw.get("note", "")),
        extra={k: v for k, v in raw.items() if k not in known},
    )


def _check_metric(path: Path, where: str, value: Any) -> None:
    # A nan or infinite baseline would pass or fail every comparison silently.
    if isinstance(value, dict):
        if not _finite(value.get("mean")):
            raise _problem(path, where, f"must hold a finite numeric 'mean', got {value.get('mean')!r}")
    elif not _finite(value):
        raise _problem(path, where, f"must be a finite number or {{mean, std, n}}, got {value!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_group_file(path: Path) -> dict[str, BaselineEntry]:
    """Entries of one group file; an absent file is an empty group."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _problem(path, "content", f"is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise _problem(path, "top level", "must be an object")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise _problem(path, "schema_version", f"must be {SCHEMA_VERSION}, got {doc.get('schema_version')!r}")
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, dict):
        raise _problem(path, "scenarios", "must be an object mapping scenario ids to entries")
    return {key: parse_entry(path, key, raw) for key, raw in scenarios.items()}


class BaselineStore:
    """Baselines of one profile; group files are read once and cached."""

    def __init__(self, root: Path, profile: str) -> None:
        self.folder = root / profile
        self.profile = profile
        self._cache: dict[str, dict[str, BaselineEntry]] = {}

    def path(self, group: str) -> Path:
        return self.folder / f"{group}.json"

    def group(self, group: str) -> dict[str, BaselineEntry]:
        if group not in self._cache:
            self._cache[group] = load_group_file(self.path(group))
        return self._cache[group]

    def get(self, group: str, scenario_id: str) -> BaselineEntry | None:
        return self.group(group).get(scenario_id)

    def record(
        self,
        group: str,
        scenario_id: str,
        expected: str,
        metrics: Mapping[str, Any],
        fingerprint: Mapping[str, Any],
        tolerances: Mapping[str, float] | None = None,
        extra: Mapping[str, Any] | None = None,
        merge: Callable[[BaselineEntry | None, BaselineEntry], BaselineEntry] | None = None,
    ) -> BaselineEntry:
        """Store a measured outcome, keeping hand-set tolerances and notes.

        ``tolerances`` (from calibration) are merged over the stored ones. The
        file is re-read under its lock, so entries another run wrote since this
        one read the group are kept. ``merge`` (stored entry, new entry) gives the
        entry to write, under that lock: a calibration pooled with the machines the
        stored one holds (:mod:`perfsuite.judge.trustworthy`).
        """
        path = self.path(group)
        try:
            with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
                entries = load_group_file(path)  # raises on a corrupt file: never overwrite it
                old = entries.get(scenario_id)
                entry = BaselineEntry(
                    expected=expected,
                    metrics=metrics,
                    tolerances={**(old.tolerances if old else {}), **(tolerances or {})},
                    fingerprint=fingerprint,
                    note=old.note if old else "",
                    extra={**(old.extra if old else {}), **(extra or {}), "recorded_at": _now()},
                )
                entry = merge(old, entry) if merge else entry
                entries[scenario_id] = entry
                self._write(group, entries)
        except Timeout:
            raise BaselineError(
                f"baseline file {path}: another process has held {path}.lock for {LOCK_TIMEOUT_S:.0f} s; "
                "if no other perfsuite run is recording baselines, delete the lock file and retry"
            ) from None
        except OSError as exc:
            raise BaselineError(
                f"baseline file {path}: cannot write it ({exc.strerror or exc}); the file on disk is "
                "unchanged. Free space or fix the folder's permissions, then rerun with --perf-update-baselines"
            ) from None
        self._cache[group] = entries
        return entry

    def _write(self, group: str, entries: Mapping[str, BaselineEntry]) -> None:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "profile": self.profile,
            "group": group,
            "scenarios": {key: entries[key].to_json() for key in sorted(entries)},
        }
        atomic_write_json(self.path(group), doc)


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()
