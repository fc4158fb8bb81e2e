"""False alarms per run: the chance that an unchanged run of N timing-judged rows fails at least one.

One row's false-alarm rate is small; a run judges dozens, so the rate a team meets is the run's. The
model (:mod:`.model`) draws every row of a run in one session: the session's offset (the machine's
state that day) is shared by all of them, and so is the baseline session's, since ``--perf-update-
baselines`` records a tier's rows in one run. The launches and steps of each row are its own. Two
figures beside the joint one need no model of that dependence: every row in its own session (the
product of the rows' pass rates; the larger figure when rows fail together, as a shared offset makes
them) and the sum of the rows' rates (Bonferroni's bound, true whatever the dependence).
Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfsuite.core.profiles import HardwareProfile
from perfsuite.judge.compare import FAMILY_ALPHA, FamilyFloor
from perfsuite.judge.simulate import model
from perfsuite.judge.simulate.noise import Row
from perfsuite.judge.simulate.rates import Rate, rate, row_for
from perfsuite.store.baselines import BaselineEntry

#: Modelled runs: +-0.3 percentage point at 90% on a figure near 5%; 50 rows take about 2 s.
DRAWS = 20_000
#: The family-wise rate a tier's runs are held to (issue 57: the pull-request tier at or below it).
TARGET = FAMILY_ALPHA


@dataclass(frozen=True)
class RunFalseAlarms:
    """The false alarms of a run of ``len(rows)`` timing-judged rows, with no change planted."""

    ids: tuple[str, ...]
    per_row: tuple[float, ...]
    """Each row's own false-alarm rate, from the same draws."""
    joint: Rate
    """Runs with at least one false alarm, every row in the run's session (the model's figure)."""

    @property
    def independent(self) -> float:
        """At least one, were every row in its own session: the product of the rows' pass rates."""
        return float(1 - np.prod([1 - p for p in self.per_row]))

    @property
    def bound(self) -> float:
        """Bonferroni's bound on at least one, whatever the rows' dependence: the sum of their rates."""
        return min(1.0, sum(self.per_row))

    @property
    def figure(self) -> float:
        """The figure a run is stated by: the larger of the joint and the independent one."""
        return max(self.joint.value, self.independent)

    def worst(self, count: int = 3) -> list[tuple[str, float]]:
        """The rows that raise most of them."""
        ranked = sorted(zip(self.ids, self.per_row, strict=True), key=lambda pair: pair[1], reverse=True)
        return [(name, p) for name, p in ranked[:count] if p > 0]

    def to_json(self) -> dict[str, object]:
        return {
            "line": self.describe(),
            "rows": list(self.ids),
            "per_row": list(self.per_row),
            "joint": self.joint.value,
            "independent": self.independent,
            "bound": self.bound,
        }

    def describe(self) -> str:
        """One line for a run's summary."""
        rows = f"{len(self.ids)} timing-judged row" + ("" if len(self.ids) == 1 else "s")
        return (
            f"false alarms: an unchanged run of these {rows} fails at least one in {percent(self.figure)} of runs "
            f"(selftest --simulate's model; at most {percent(self.bound)} whatever the rows' dependence)"
        )


def run_false_alarms(
    rows: Sequence[tuple[str, Row]], rules: model.Rules, draws: int = DRAWS, seed: int = 0
) -> RunFalseAlarms:
    """``draws`` unchanged runs of these rows (id, modelled row), each judged by the gate's rules."""
    rng = np.random.default_rng(seed)
    base_session, run_session = rng.standard_normal(draws), rng.standard_normal(draws)
    failed = np.zeros(draws, dtype=bool)
    per_row = []
    for _, row in rows:
        drawn = model.gate_draws(row, rules, rng, draws, (base_session, run_session))
        alarms = model.gate_verdicts(drawn, row, rules, 0.0) == model.REGRESSION
        per_row.append(float(np.mean(alarms)))
        failed |= alarms
    return RunFalseAlarms(tuple(name for name, _ in rows), tuple(per_row), rate(failed))


def of_baselines(
    judged: Sequence[tuple[str, BaselineEntry]], profile: HardwareProfile, confirm: int = 1
) -> RunFalseAlarms | None:
    """The false alarms of a run that judged these rows' timing against these baselines (None when
    no baseline stores the spread a row is modelled by)."""
    rows = [(name, row) for name, entry in judged if (row := row_for(entry, profile)) is not None]
    return run_false_alarms(rows, model.Rules.of(profile, confirm, len(rows))) if rows else None


def floor_for(baseline: BaselineEntry, profile: HardwareProfile, rows: int) -> FamilyFloor | None:
    """The floor of a row's timed tolerances in a run that judges ``rows`` rows' timing, from the row's
    model (``Row.family_floor``); None for a run of one row, or a baseline with no spread to model."""
    row = row_for(baseline, profile) if rows > 1 else None
    return FamilyFloor(rows, row.family_floor(rows)) if row is not None else None


def percent(x: float) -> str:
    """A run's rate as percent, with the digits a small one needs (0.47%, 18%)."""
    return f"{x:.2%}" if x < 0.1 else f"{x:.0%}"
