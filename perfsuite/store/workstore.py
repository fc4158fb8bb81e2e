"""Stored step work: ``baselines/<profile>/work/<group>.json``, one entry per scenario.

Written with the baselines (``--perf-update-baselines``), in a file of its own so the baseline
files' diffs stay readable, and never by a normal run. Unlike timing baselines there is one entry
per scenario whatever the processor: the counts are the code's, not the machine's
(docs/lab/work-counts.md). Each entry names the library versions it was counted under: another
torch, DeepSpeed or transformers calls other ops by design, which is a change of environment, not
of the team's code. The same rules as baselines: an atomic write under the file's lock, merged
into what is on disk, and a file that cannot be read is an error naming it, never rewritten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfsuite.core.files import atomic_write_json
from perfsuite.core.protocol import ProtocolError, decode
from perfsuite.core.workcount import VERSION, WorkCount
from perfsuite.store.baselines import BaselineError, locked

FOLDER = "work"


@dataclass(frozen=True)
class StoredWork:
    """A scenario's recorded counts and the library versions they were counted under."""

    count: WorkCount
    packages: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {**self.count.to_json(), "packages": dict(sorted(self.packages.items()))}


class WorkStore:
    """The stored step work of one hardware profile (each group file read once, then cached)."""

    def __init__(self, root: Path, profile: str) -> None:
        self.folder = root / profile / FOLDER
        self._cache: dict[str, dict[str, StoredWork]] = {}

    def path(self, group: str) -> Path:
        return self.folder / f"{group}.json"

    def get(self, group: str, scenario_id: str) -> StoredWork | None:
        if group not in self._cache:
            self._cache[group] = _load(self.path(group))
        return self._cache[group].get(scenario_id)

    def record(self, group: str, scenario_id: str, stored: StoredWork) -> Path:
        """Store ``stored`` for ``scenario_id``, merged into the file as it is on disk; its path."""
        path = self.path(group)
        with locked(path, "work file"):
            entries = _load(path)
            entries[scenario_id] = stored
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, _document(group, entries))
        self._cache[group] = entries
        return path


def _document(group: str, entries: Mapping[str, StoredWork]) -> dict[str, Any]:
    return {
        "version": VERSION,
        "group": group,
        "written_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "scenarios": {key: entries[key].to_json() for key in sorted(entries)},
    }


def _load(path: Path) -> dict[str, StoredWork]:
    if not path.exists():
        return {}
    fix = "fix or delete it, then record the counts again with --perf-update-baselines"
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("scenarios"), dict):
            raise BaselineError(f"work file {path}: not a step-work file of version {VERSION}; {fix}")
        return {key: _entry(value, f"scenarios[{key!r}]") for key, value in doc["scenarios"].items()}
    except (OSError, json.JSONDecodeError, ProtocolError, TypeError) as exc:
        raise BaselineError(f"work file {path}: cannot be read ({exc}); {fix}") from None


def _entry(value: Any, where: str) -> StoredWork:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected an object")
    fields = dict(value)
    packages = fields.pop("packages", {})
    if not isinstance(packages, dict) or not all(isinstance(v, str) for v in packages.values()):
        raise ProtocolError(f"{where}.packages: must map each library to its version")
    return StoredWork(decode(WorkCount, fields, where), packages)
