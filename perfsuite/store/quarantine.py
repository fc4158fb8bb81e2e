"""Quarantine, one scenario at a time: ``baselines/<profile>/quarantine.toml``.

Real suites have a flaky benchmark or two. Rather than switch off the whole
gate (``--perf-allow-unjudged``), a committed file lists scenario ids, each
with a reason, an owner and an expiry date::

    [[scenario]]
    id = "model_state_sharding.zero3_amp"
    reason = "allgather timing swings 20% on the shared runner (#123)"
    owner = "alice"
    expires = 2026-12-31

A quarantined scenario runs and is reported, but its verdict does not gate,
and the coverage line counts it apart. An entry past its expiry date fails
the run, naming it: a quarantine is a loan, not a deletion. Pytest side,
torch-free.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FILENAME = "quarantine.toml"
FIELDS = ("id", "reason", "owner", "expires")


class QuarantineError(ValueError):
    """A quarantine file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Entry:
    id: str
    reason: str
    owner: str
    expires: date

    def expired(self, today: date) -> bool:
        return today > self.expires

    def describe(self) -> str:
        return f"quarantined until {self.expires.isoformat()} by {self.owner}: {self.reason}"


def load(path: Path) -> dict[str, Entry]:
    """The entries of ``path`` by scenario id ({} when there is no file)."""
    if not path.exists():
        return {}
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QuarantineError(f"{path}: not readable TOML ({exc}); fix or remove it") from None
    unknown = set(doc) - {"scenario"}
    if unknown:
        raise QuarantineError(f"{path}: unknown table(s) {sorted(unknown)}; entries go in [[scenario]] tables")
    raw = doc.get("scenario", [])
    if not isinstance(raw, list):
        raise QuarantineError(f"{path}: 'scenario' must be an array of tables ([[scenario]])")
    entries: dict[str, Entry] = {}
    for number, table in enumerate(raw, 1):
        entry = _entry(path, number, table)
        if entry.id in entries:
            raise QuarantineError(f"{path}: scenario {entry.id!r} is listed twice; keep one entry")
        entries[entry.id] = entry
    return entries


def _entry(path: Path, number: int, table: Mapping[str, Any]) -> Entry:
    where = f"{path}: [[scenario]] number {number}"
    unknown = set(table) - set(FIELDS)
    if unknown:
        raise QuarantineError(f"{where}: unknown field(s) {sorted(unknown)}; an entry has {', '.join(FIELDS)}")
    for name in ("id", "reason", "owner"):
        value = table.get(name)
        if not isinstance(value, str) or not value.strip():
            raise QuarantineError(f"{where}: field '{name}' must be a non-empty string")
    return Entry(table["id"], table["reason"], table["owner"], _date(where, table.get("expires")))


def _date(where: str, value: Any) -> date:
    if isinstance(value, datetime):  # a TOML date-time: its day
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    raise QuarantineError(f"{where}: field 'expires' must be a date such as 2026-12-31, got {value!r}")


def expired(entries: Mapping[str, Entry], today: date) -> list[str]:
    """One line per expired entry, naming it, its owner and the file to fix."""
    return [
        f"quarantine of {e.id} expired on {e.expires.isoformat()} (owner {e.owner}, reason: {e.reason}): "
        "fix the scenario and remove the entry, or renew its expiry date"
        for e in entries.values()
        if e.expired(today)
    ]
