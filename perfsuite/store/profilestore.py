"""Stored op profiles: ``baselines/<profile>/op_profiles/<group>.json``, one per group.

Written when a baseline is recorded, beside it but in a file of its own, so
the baseline files' diffs stay readable. The same rules as baselines: an atomic
write under the group file's lock, merged into what is on disk, and a corrupt
or foreign file is an error that names it and is never rewritten. A summary
over :data:`perfsuite.core.opprofile.MAX_SUMMARY_BYTES` keeps fewer ops until it fits.
On cpu, as its baselines, one profile per processor: the first where a scenario's profile
always was, the others in its ``other_processors``, each naming its ``processor``; such a
file is version 2, so an older perfsuite refuses it rather than recording over it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfsuite.core.files import atomic_write_json
from perfsuite.core.opprofile import MAX_SUMMARY_BYTES, OTHER, VERSION, OpProfile, OpStat
from perfsuite.core.protocol import ProtocolError, decode
from perfsuite.store.baselines import OTHER_PROCESSORS, BaselineError, locked, same_processor, slot_among

FOLDER = "op_profiles"
#: Key naming the processor a stored profile was recorded on (the other processors' profiles of a
#: scenario are under ``other_processors``, as in a baseline file: :mod:`perfsuite.store.baselines`).
PROCESSOR = "processor"
#: The file version written when a profile names its processor, so that an older perfsuite refuses
#: the file rather than recording over it; a file without is written as version 1, as before.
NAMED_VERSION = 2
READABLE_VERSIONS = (1, NAMED_VERSION)


@dataclass(frozen=True)
class StoredProfile:
    """One processor's op profile of a scenario (``processor`` None: recorded before perfsuite
    kept it, or on a profile that keeps one profile per scenario)."""

    profile: OpProfile
    processor: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Lookup:
    """This processor's stored profile of a scenario, if any, and how many other processors have one."""

    profile: OpProfile | None
    elsewhere: int = 0


class ProfileStore:
    """The op profiles of one hardware profile (read once per group, then cached).

    ``processor``: this run's, where the profile keeps an entry per processor (cpu,
    ``HardwareProfile.entry_processor``). Op profiles follow their baselines: a read gives this
    processor's profile only (another processor runs other kernels, so its ops would explain the
    processor, not the change), and a recording replaces only this processor's, which entry
    :func:`perfsuite.store.baselines.slot_among` picks as it does for baselines."""

    def __init__(self, root: Path, profile: str, processor: Mapping[str, Any] | None = None) -> None:
        self.folder = root / profile / FOLDER
        self.processor = processor
        self._cache: dict[str, dict[str, tuple[StoredProfile, ...]]] = {}

    def path(self, group: str) -> Path:
        return self.folder / f"{group}.json"

    def lookup(self, group: str, scenario_id: str) -> Lookup:
        if group not in self._cache:
            self._cache[group] = _load(self.path(group))
        entries = self._cache[group].get(scenario_id, ())
        at = slot_among([e.processor for e in entries], self.processor)
        return Lookup(entries[at].profile if at is not None else None, len(entries) - (at is not None))

    def record(self, group: str, scenario_id: str, profile: OpProfile) -> OpProfile:
        """Store ``profile`` (trimmed to the size cap) as this processor's for ``scenario_id``; returns what was stored."""
        path = self.path(group)
        stored = fit(dataclasses.replace(profile, trace=""))  # a trace path means nothing on another machine
        with locked(path, "op profile file"):
            entries = _load(path)
            entries[scenario_id] = _placed(entries.get(scenario_id, ()), StoredProfile(stored, self.processor))
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, _document(group, entries))
        self._cache[group] = entries
        return stored


def _placed(entries: tuple[StoredProfile, ...], new: StoredProfile) -> tuple[StoredProfile, ...]:
    """``entries`` with ``new`` in its processor's slot, or added after the others."""
    at = slot_among([e.processor for e in entries], new.processor)
    return (*entries, new) if at is None else (*entries[:at], new, *entries[at + 1 :])


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


def _document(group: str, entries: Mapping[str, tuple[StoredProfile, ...]]) -> dict[str, Any]:
    named = any(e.processor is not None for found in entries.values() for e in found)
    return {
        "version": NAMED_VERSION if named else VERSION,
        "group": group,
        "written_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "scenarios": {key: _scenario_json(entries[key]) for key in sorted(entries)},
    }


def _scenario_json(entries: Sequence[StoredProfile]) -> dict[str, Any]:
    """The first processor's profile where a single-processor file keeps it; the others in its
    ``other_processors``, each naming its processor."""
    first, *others = [_entry_json(e) for e in entries]
    return {**first, OTHER_PROCESSORS: others} if others else first


def _entry_json(entry: StoredProfile) -> dict[str, Any]:
    found = entry.profile.to_json()
    return {**found, PROCESSOR: dict(entry.processor)} if entry.processor is not None else found


def _load(path: Path) -> dict[str, tuple[StoredProfile, ...]]:
    if not path.exists():
        return {}
    fix = "fix or delete it, then store a fresh one with --perf-update-baselines"
    try:
        doc = json.loads(path.read_text())
        if (
            not isinstance(doc, dict)
            or doc.get("version") not in READABLE_VERSIONS
            or not isinstance(doc.get("scenarios"), dict)
        ):
            raise BaselineError(f"op profile file {path}: not an op profile file of version {READABLE_VERSIONS}; {fix}")
        return {key: _entries(value, f"scenarios[{key!r}]") for key, value in doc["scenarios"].items()}
    except (OSError, json.JSONDecodeError, ProtocolError, TypeError) as exc:
        raise BaselineError(f"op profile file {path}: cannot be read ({exc}); {fix}") from None


def _entries(value: Any, where: str) -> tuple[StoredProfile, ...]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected an object")
    first = dict(value)
    others = first.pop(OTHER_PROCESSORS, [])
    if not isinstance(others, list):
        raise ProtocolError(f"{where}.{OTHER_PROCESSORS}: must be a list of profiles, one per processor")
    entries = [_entry(first, where)] + [_entry(o, f"{where}.{OTHER_PROCESSORS}[{n}]") for n, o in enumerate(others)]
    for n, entry in enumerate(entries[1:], 1):
        if entry.processor is None or any(same_processor(e.processor, entry.processor) for e in entries[:n]):
            raise ProtocolError(f"{where}: profile {n} must name a processor no other profile of the scenario has")
    return tuple(entries)


def _entry(value: Any, where: str) -> StoredProfile:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected an object")
    fields = dict(value)
    proc = fields.pop(PROCESSOR, None)
    if proc is not None and not isinstance(proc, dict):
        raise ProtocolError(f"{where}.{PROCESSOR}: must be an object (the fingerprint's processor)")
    return StoredProfile(decode(OpProfile, fields, where), proc)
