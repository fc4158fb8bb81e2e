"""Stored op profiles: ``baselines/<profile>/op_profiles/<group>.json``, one per group.

Written when a baseline is recorded, beside it but in a file of its own, so
the baseline files' diffs stay readable. The same rules as baselines: an atomic
write under the group file's lock, merged into what is on disk, and a corrupt
or foreign file is an error that names it and is never rewritten. A summary
over :data:`perfsuite.core.opprofile.MAX_SUMMARY_BYTES` keeps fewer ops until it fits.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from perfsuite.core.files import atomic_write_json
from perfsuite.core.opprofile import MAX_SUMMARY_BYTES, OTHER, VERSION, OpProfile, OpStat
from perfsuite.core.protocol import ProtocolError, decode
from perfsuite.store.baselines import LOCK_TIMEOUT_S, BaselineError

FOLDER = "op_profiles"


class ProfileStore:
    """The op profiles of one hardware profile (read once per group, then cached)."""

    def __init__(self, root: Path, profile: str) -> None:
        self.folder = root / profile / FOLDER
        self._cache: dict[str, dict[str, OpProfile]] = {}

    def path(self, group: str) -> Path:
        return self.folder / f"{group}.json"

    def get(self, group: str, scenario_id: str) -> OpProfile | None:
        if group not in self._cache:
            self._cache[group] = _load(self.path(group))
        return self._cache[group].get(scenario_id)

    def record(self, group: str, scenario_id: str, profile: OpProfile) -> OpProfile:
        """Store ``profile`` (trimmed to the size cap) for ``scenario_id``; returns what was stored."""
        path = self.path(group)
        stored = fit(dataclasses.replace(profile, trace=""))  # a trace path means nothing on another machine
        try:
            with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
                entries = _load(path)
                entries[scenario_id] = stored
                self.folder.mkdir(parents=True, exist_ok=True)
                atomic_write_json(path, _document(group, entries))
        except Timeout:
            raise BaselineError(f"op profile file {path}: another process holds {path}.lock") from None
        except OSError as exc:
            raise BaselineError(f"op profile file {path}: cannot write it ({exc.strerror or exc})") from None
        self._cache[group] = entries
        return stored


def fit(profile: OpProfile, limit: int = MAX_SUMMARY_BYTES) -> OpProfile:
    """``profile`` with its smallest ops folded into ``[other]`` until its JSON is at most ``limit`` bytes."""
    while len(json.dumps(profile.to_json())) > limit and len(profile.ops) > 2:
        named = [op for op in profile.ops if op.name != OTHER]
        folded = [*(op for op in profile.ops if op.name == OTHER), named[-1]]
        other = OpStat(
            OTHER, *(sum(getattr(op, f) for op in folded) for f in ("calls", "cpu_us", "device_us", "alloc_bytes"))
        )
        profile = dataclasses.replace(profile, ops=(*named[:-1], other))
    return profile


def _document(group: str, entries: Mapping[str, OpProfile]) -> dict[str, Any]:
    return {
        "version": VERSION,
        "group": group,
        "written_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "scenarios": {key: entries[key].to_json() for key in sorted(entries)},
    }


def _load(path: Path) -> dict[str, OpProfile]:
    if not path.exists():
        return {}
    fix = "fix or delete it, then store a fresh one with --perf-update-baselines"
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("scenarios"), dict):
            raise BaselineError(f"op profile file {path}: not a version-{VERSION} op profile file; {fix}")
        return {key: decode(OpProfile, value) for key, value in doc["scenarios"].items()}
    except (OSError, json.JSONDecodeError, ProtocolError, TypeError) as exc:
        raise BaselineError(f"op profile file {path}: cannot be read ({exc}); {fix}") from None
