"""The estimates table the budget is judged by.

Before a step starts, the bootstrap asks whether the time left can hold it,
from this table. It lives beside the profile's baselines
(``baselines/<profile>/bootstrap-costs.json``), so the cpu run and every
earlier step, in this run or an earlier session on the same kind of machine,
keep it up to date: each finished launch replaces the estimate of its
scenario. A scenario never measured here is estimated from its group's
measured launches, else from those of its workload kind, else from the
kind's default below.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.commands.bootstrap.plan import Target
from perfsuite.core.files import atomic_write_json

SCHEMA_VERSION = 1
#: Seconds of one launch by workload kind, before anything was measured here,
#: rounded up from what was measured elsewhere. cpu: a 4-minute bootstrap on
#: the 2-core VM (docs/lab/bootstrap-timings.md; train 3.6-8.6 s, microbench
#: 1.5-4.2, the gloo collective 2.5, a cold compile row 10.8). cuda: the first
#: H200 run (docs/gpu-runs/2026-11-26-nvidia-h200-x1; seed shapes on one GPU:
#: train 16-29 s, microbench 10-14, copy 7); collectives were not measured.
DEFAULT_LAUNCH_S: Mapping[str, Mapping[str, float]] = {
    "cpu": {"train": 8.0, "trainer": 8.0, "microbench": 4.0, "membw": 3.0, "collective": 4.0},
    "cuda": {"train": 30.0, "trainer": 30.0, "microbench": 15.0, "membw": 10.0, "collective": 30.0},
}
#: Seconds of the fixed steps and of one pytest start, likewise (cpu 2.3 / 3.0 /
#: 1.4 measured, H200 8.6 / 3.6 / 1.7).
DEFAULT_FIXED_S: Mapping[str, Mapping[str, float]] = {
    "cpu": {"doctor": 5.0, "report": 5.0, "pytest": 2.0},
    "cuda": {"doctor": 15.0, "report": 10.0, "pytest": 3.0},
}


class CostsError(ValueError):
    """The estimates file is unreadable; the message names it."""


@dataclass
class Costs:
    device: str
    launch_s: dict[str, float] = field(default_factory=dict)
    """Measured seconds of one launch, by scenario id."""
    fixed_s: dict[str, float] = field(default_factory=dict)
    """Measured seconds of doctor, report and one pytest start."""

    @classmethod
    def load(cls, path: Path, device: str) -> Costs:
        if not path.exists():
            return cls(device)
        try:
            doc = json.loads(path.read_text())
            return cls(
                device,
                {k: float(v) for k, v in doc["launch_s"].items()},
                {k: float(v) for k, v in doc["fixed_s"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CostsError(
                f"{path}: not a bootstrap estimates table ({exc}); delete it to start from the defaults"
            ) from None

    def save(self, path: Path) -> None:
        atomic_write_json(
            path,
            {
                "schema_version": SCHEMA_VERSION,
                "device": self.device,
                "launch_s": self.launch_s,
                "fixed_s": self.fixed_s,
            },
        )

    def launch(self, target: Target, peers: Sequence[Target]) -> float:
        """Estimated seconds of one launch of ``target``; ``peers`` are the other targets (for group means)."""
        if target.id in self.launch_s:
            return self.launch_s[target.id]
        # Its group from every launch measured here, selected now or not (a -k run's new rows
        # are priced by their group's old ones); its kind from this run's targets.
        group = [seconds for key, seconds in self.launch_s.items() if key.split(".", 1)[0] == target.group]
        kind = [self.launch_s[p.id] for p in peers if p.kind == target.kind and p.id in self.launch_s]
        for measured in (group, kind):
            if measured:
                return statistics.mean(measured)
        return DEFAULT_LAUNCH_S[self.device].get(target.kind, max(DEFAULT_LAUNCH_S[self.device].values()))

    def fixed(self, name: str) -> float:
        return self.fixed_s.get(name, DEFAULT_FIXED_S[self.device][name])

    def table(self, targets: Sequence[Target]) -> tuple[dict[str, float], dict[str, float]]:
        """(launch seconds by target id, fixed seconds by name) for the planner."""
        launch = {t.id: self.launch(t, targets) for t in targets}
        return launch, {name: self.fixed(name) for name in DEFAULT_FIXED_S[self.device]}

    def learn(self, results: Sequence[Mapping[str, Any]], launches: int, wall_s: float) -> None:
        """Take one step's measured launches (its results file) and its pytest overhead."""
        measured = 0.0
        for result in results:
            seconds = float(result.get("wall_s") or 0.0)
            if seconds > 0 and result.get("status") in ("ok", "oom"):
                self.launch_s[str(result["id"])] = round(seconds, 2)
                measured += seconds * launches
        if results and measured and launches == 1:
            self.fixed_s["pytest"] = round(max(1.0, wall_s - measured), 2)

    def learn_at_least(self, targets: Sequence[Target], wall_s: float) -> None:
        """A step stopped after ``wall_s`` per launch: its targets take longer than that between them."""
        share = wall_s / max(1, len(targets))
        for target in targets:
            self.launch_s[target.id] = round(max(self.launch_s.get(target.id, 0.0), share), 2)

    def learn_fixed(self, name: str, wall_s: float) -> None:
        self.fixed_s[name] = round(wall_s, 2)
