"""What the bootstrap has done, on disk after every step.

``<out>/state.json`` is rewritten atomically after each step, so a run that is
killed or times out loses only the step in progress, and the next run (same
``--out``) resumes with what is missing. ``--redo`` starts over. Baselines and
calibrations already in the baselines folder count as done too (see
:func:`done_in`), so a later session resumes from what an earlier one committed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from perfsuite.commands.bootstrap.plan import Done, Target
from perfsuite.core.files import atomic_write_json
from perfsuite.store.baselines import BaselineEntry, BaselineError, BaselineStore

#: ``unreliable``: measured, but too noisy or throttled to record; retried on a rerun, not a failure.
Status = Literal["done", "skipped", "failed", "unreliable", "interrupted", "missing"]
#: Statuses a resumed run does not redo.
FINISHED: tuple[Status, ...] = ("done", "skipped")


@dataclass
class StepRecord:
    status: Status
    wall_s: float = 0.0
    estimate_s: float = 0.0
    message: str = ""
    finished_at: str = field(default_factory=lambda: datetime.now(timezone.utc).replace(microsecond=0).isoformat())


@dataclass
class State:
    path: Path
    profile: str
    steps: dict[str, StepRecord] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    """What steps found that the report shows: doctor, ceilings, detection."""

    @classmethod
    def load(cls, path: Path, profile: str, redo: bool) -> State:
        if redo or not path.exists():
            return cls(path, profile)
        try:
            doc = json.loads(path.read_text())
            steps = {key: StepRecord(**record) for key, record in doc["steps"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(
                f"perfsuite bootstrap: {path} is not a bootstrap state ({exc}); rerun with --redo"
            ) from None
        if doc.get("profile") != profile:
            raise SystemExit(
                f"perfsuite bootstrap: {path} belongs to profile {doc.get('profile')!r}, this is {profile!r}; "
                "give another --out or rerun with --redo"
            )
        return cls(path, profile, steps, dict(doc.get("facts", {})))

    def finished(self, key: str) -> bool:
        record = self.steps.get(key)
        return record is not None and record.status in FINISHED

    def record(self, key: str, record: StepRecord) -> None:
        self.steps[key] = record
        self.save()

    def save(self) -> None:
        doc = {"profile": self.profile, "steps": {k: asdict(v) for k, v in self.steps.items()}, "facts": self.facts}
        atomic_write_json(self.path, doc)


def done_in(
    store: BaselineStore, targets: list[Target], repeats: int, usable: Callable[[BaselineEntry], bool] = lambda e: True
) -> Done:
    """Targets that already have a baseline ``usable`` here, and those calibrated over at least
    ``repeats`` launches. A baseline from another processor, where the profile does not compare
    timings across processors, judges no timing here: recording this machine's is still to do."""
    baselines, calibrated = set(), set()
    for target in targets:
        try:
            entry = store.get(target.group, target.id)
        except BaselineError:
            continue  # a corrupt group file: its step reports it when it runs
        if entry is None or not usable(entry):
            continue
        baselines.add(target.id)
        calibration = entry.extra.get("calibration") or {}
        if int(calibration.get("repeats", 0)) >= repeats:
            calibrated.add(target.id)
    return Done(frozenset(baselines), frozenset(calibrated))
