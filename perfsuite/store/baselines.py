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

Entries per processor: a profile that judges timing on the recording processor only (cpu:
``HardwareProfile.timed_on_other_processor``) keeps one entry per processor and scenario, so two
machines of one profile never overwrite each other's. A scenario's first entry stays where a
version-1 file has it, ``scenarios[id]``; the entries of other processors follow in that
object's ``other_processors`` list, each a whole entry naming its processor in its fingerprint.
A file that holds any is written as ``schema_version`` 2, so an older perfsuite refuses it
rather than re-recording over the first entry; a file without is written as version 1, as
before. Which entry a run reads and replaces is :func:`slot`.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from perfsuite.core import processor as processors
from perfsuite.core.files import atomic_write_json
from perfsuite.core.metrics import METRICS
from perfsuite.core.workloads.base import OUTCOMES

#: The version written when a scenario holds entries of several processors; a file without is
#: written as version 1, which every perfsuite reads.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: Key of a scenario's entries recorded on other processors than its first entry's.
OTHER_PROCESSORS = "other_processors"
LOCK_TIMEOUT_S = 120.0  # a write holds the lock for milliseconds; this long means a stuck process


class BaselineError(Exception):
    """A baseline file cannot be used; the message names the file and the fix."""


@contextlib.contextmanager
def locked(path: Path, what: str) -> Iterator[None]:
    """Hold ``path``'s lock while the body reads the file as it is on disk, merges and writes it
    atomically; a lock held too long or a write that fails is a :class:`BaselineError` naming
    ``what`` (``op profile file``) and the file."""
    try:
        with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            yield
    except Timeout:
        raise BaselineError(f"{what} {path}: another process holds {path}.lock") from None
    except OSError as exc:
        raise BaselineError(f"{what} {path}: cannot write it ({exc.strerror or exc})") from None


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


def parse_entry(path: Path, key: str, raw: Any, where: str = "") -> BaselineEntry:
    """One processor's entry (``where``: its place in the file, for the error)."""
    where = where or f"scenarios[{key!r}]"
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
    known = {"expected", "metrics", "tolerances", "fingerprint", "note", OTHER_PROCESSORS}
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
        # The t-test reads the spread and the count when they are there.
        std, n = value.get("std", 0.0), value.get("n", 0)
        if not _finite(std) or std < 0:
            raise _problem(path, f"{where}.std", f"must be a finite number >= 0 (or absent), got {std!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise _problem(path, f"{where}.n", f"must be a whole number >= 0 (or absent), got {n!r}")
    elif not _finite(value):
        raise _problem(path, where, f"must be a finite number or {{mean, std, n}}, got {value!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_scenario(path: Path, key: str, raw: Any) -> tuple[BaselineEntry, ...]:
    """Every processor's entry of one scenario, its first entry first. Each entry in
    ``other_processors`` must name its processor, and no two entries the same one: which
    would judge the run would otherwise be a guess."""
    first = parse_entry(path, key, raw)
    others = raw.get(OTHER_PROCESSORS, [])
    where = f"scenarios[{key!r}].{OTHER_PROCESSORS}"
    if not isinstance(others, list):
        raise _problem(path, where, "must be a list of entries, one per processor")
    entries = [first]
    for n, other in enumerate(others):
        entry = parse_entry(path, key, other, f"{where}[{n}]")
        if OTHER_PROCESSORS in entry.extra or not isinstance(processor_of(entry), Mapping):
            raise _problem(path, f"{where}[{n}]", "must be one processor's entry, naming it in fingerprint.processor")
        if any(same_processor(processor_of(e), processor_of(entry)) for e in entries):
            raise _problem(path, f"{where}[{n}]", "was recorded on a processor another entry of the scenario has")
        entries.append(entry)
    return tuple(entries)


def processor_of(entry: BaselineEntry) -> Mapping[str, Any] | None:
    """The processor an entry was recorded on (None: recorded before perfsuite kept it)."""
    proc = entry.fingerprint.get("processor")
    return proc if isinstance(proc, Mapping) else None


def slot(entries: Sequence[BaselineEntry], processor: Mapping[str, Any] | None) -> int | None:
    """Which of a scenario's entries is ``processor``'s: the one a run there is judged against in
    full and the one its recording replaces. That processor's own entry, else an entry that
    names no processor (recorded before perfsuite kept it: it may be this one's), else None (a
    recording adds an entry beside the others). ``processor`` None (a profile that judges timing
    across processors) is the first entry, the scenario's one."""
    return slot_among([processor_of(entry) for entry in entries], processor)


def slot_among(procs: Sequence[Mapping[str, Any] | None], processor: Mapping[str, Any] | None) -> int | None:
    """:func:`slot` over the processors of a scenario's entries (None: an entry naming none), for
    anything stored per processor (baselines, op profiles)."""
    if processor is None:
        return 0 if procs else None
    same = [n for n, proc in enumerate(procs) if same_processor(proc, processor)]
    unknown = [n for n, proc in enumerate(procs) if proc is None]
    found = same or unknown
    return found[0] if found else None


def same_processor(one: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> bool:
    return one is not None and other is not None and processors.key(one) == processors.key(other)


def chosen(entries: Sequence[BaselineEntry], processor: Mapping[str, Any] | None) -> BaselineEntry | None:
    """The entry that judges a run on ``processor``: its own (timing and memory), else the first
    entry, recorded on another processor, which judges memory and exact bytes only (the profile
    says so: ``other_machine``, :mod:`perfsuite.judge.judging`). The first rather than the newest,
    so which processor's memory a row is held to does not change with each recording."""
    at = slot(entries, processor)
    return entries[0 if at is None else at] if entries else None


def load_group(path: Path) -> dict[str, tuple[BaselineEntry, ...]]:
    """Every processor's entries per scenario of one group file; an absent file is an empty group."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _problem(path, "content", f"is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise _problem(path, "top level", "must be an object")
    if doc.get("schema_version") not in READABLE_VERSIONS:
        raise _problem(
            path,
            "schema_version",
            f"must be one of {READABLE_VERSIONS} (a newer perfsuite wrote it?), got {doc.get('schema_version')!r}",
        )
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, dict):
        raise _problem(path, "scenarios", "must be an object mapping scenario ids to entries")
    return {key: parse_scenario(path, key, raw) for key, raw in scenarios.items()}


def load_group_file(path: Path) -> dict[str, BaselineEntry]:
    """Each scenario's first entry in one group file (every processor's: :func:`load_group`)."""
    return {key: entries[0] for key, entries in load_group(path).items()}


#: The bootstrap's measured launch costs, kept beside a profile's group files (commands.bootstrap.costs).
COSTS_FILENAME = "bootstrap-costs.json"


class BaselineStore:
    """Baselines of one profile; group files are read once and cached.

    ``processor``: this run's, where the profile keeps an entry per processor
    (``HardwareProfile.entry_processor``): reads give its entry where there is one (:func:`chosen`)
    and a recording replaces only its entry. None: each scenario's first entry, the only one on a
    profile that judges timing across processors (and what tools that judge nothing read).
    """

    def __init__(self, root: Path, profile: str, processor: Mapping[str, Any] | None = None) -> None:
        self.folder = root / profile
        self.profile = profile
        self.processor = processor
        self._cache: dict[str, dict[str, tuple[BaselineEntry, ...]]] = {}

    def path(self, group: str) -> Path:
        return self.folder / f"{group}.json"

    def groups(self) -> list[str]:
        """The groups with a baseline file here (the bootstrap's cost file beside them is none)."""
        files = self.folder.glob("*.json") if self.folder.is_dir() else ()
        return sorted(path.stem for path in files if path.name != COSTS_FILENAME)

    def _entries(self, group: str) -> dict[str, tuple[BaselineEntry, ...]]:
        if group not in self._cache:
            self._cache[group] = load_group(self.path(group))
        return self._cache[group]

    def group(self, group: str) -> dict[str, BaselineEntry]:
        """Each scenario's entry for this store's processor (:func:`chosen`)."""
        found = {key: chosen(entries, self.processor) for key, entries in self._entries(group).items()}
        return {key: entry for key, entry in found.items() if entry is not None}

    def get(self, group: str, scenario_id: str) -> BaselineEntry | None:
        return chosen(self.entries(group, scenario_id), self.processor)

    def own(self, group: str, scenario_id: str) -> BaselineEntry | None:
        """The entry a recording here replaces (:func:`slot`); None where this processor has none."""
        entries = self.entries(group, scenario_id)
        at = slot(entries, self.processor)
        return None if at is None else entries[at]

    def entries(self, group: str, scenario_id: str) -> tuple[BaselineEntry, ...]:
        """Every processor's entry of one scenario, its first entry first."""
        return self._entries(group).get(scenario_id, ())

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
        one read the group are kept. Only this store's processor's entry is replaced
        (:func:`slot`; where it has none, one is added beside the others): other processors'
        entries are written back as they are on disk. ``merge`` (stored entry, new entry) gives the
        entry to write, under that lock: a calibration pooled with the machines the
        stored one holds (:mod:`perfsuite.judge.calibration`).
        """
        path = self.path(group)
        try:
            with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
                groups = load_group(path)  # raises on a corrupt file: never overwrite it
                entries = list(groups.get(scenario_id, ()))
                at = slot(entries, self.processor)
                old = entries[at] if at is not None else None
                entry = BaselineEntry(
                    expected=expected,
                    metrics=metrics,
                    tolerances={**(old.tolerances if old else {}), **(tolerances or {})},
                    fingerprint=fingerprint,
                    note=old.note if old else "",
                    extra={**(old.extra if old else {}), **(extra or {}), "recorded_at": _now()},
                )
                entry = merge(old, entry) if merge else entry
                if at is None:
                    entries.append(entry)  # a processor new to this scenario: beside the others
                else:
                    entries[at] = entry
                groups[scenario_id] = tuple(entries)
                self._write(group, groups)
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
        self._cache[group] = groups
        return entry

    def _write(self, group: str, groups: Mapping[str, Sequence[BaselineEntry]]) -> None:
        several = any(len(entries) > 1 for entries in groups.values())
        doc = {
            "schema_version": SCHEMA_VERSION if several else 1,
            "profile": self.profile,
            "group": group,
            "scenarios": {key: scenario_json(groups[key]) for key in sorted(groups)},
        }
        atomic_write_json(self.path(group), doc)


def scenario_json(entries: Sequence[BaselineEntry]) -> dict[str, Any]:
    """A scenario's entries as stored: the first at the top, the others' in ``other_processors``."""
    first, *others = entries
    return {**first.to_json(), **({OTHER_PROCESSORS: [e.to_json() for e in others]} if others else {})}


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()
