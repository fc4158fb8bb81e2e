"""Rates with their intervals, and the smallest slowdown a row's gate catches 9 times in 10."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats as scipy_stats

from perfsuite.judge.abtest import REV_TOLERANCE as AB_REV_TOLERANCE
from perfsuite.judge.simulate import model
from perfsuite.judge.simulate.noise import ProfileNoise, Row, noise_of, primary_of, row_of
from perfsuite.spec.profiles import HardwareProfile
from perfsuite.store.baselines import BaselineEntry

#: The largest slowdown searched (x21 the step time): beyond it a row is called blind.
MAX_SLOWDOWN = 20.0
#: "Caught 9 times in 10".
POWER = 0.9


@dataclass(frozen=True)
class Rate:
    """``k`` of ``n`` with the 95% Wilson interval."""

    k: int
    n: int

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else float("nan")

    def interval(self) -> tuple[float, float]:
        ci = scipy_stats.binomtest(self.k, self.n).proportion_ci(0.95, method="wilson")
        return float(ci.low), float(ci.high)

    def overlaps(self, other: Rate) -> bool:
        (lo, hi), (other_lo, other_hi) = self.interval(), other.interval()
        return lo <= other_hi and other_lo <= hi

    def show(self) -> str:
        lo, hi = self.interval()
        return f"{_pct(self.value)} ({_pct(lo)}-{_pct(hi)})"


def _pct(x: float) -> str:
    """Percent with the digits a small rate needs: 43.2%, 0.0012%."""
    if x == 0 or x >= 0.01:
        return f"{x:.1%}"
    return np.format_float_positional(x * 100, precision=2, fractional=False) + "%"


def rate(hits: NDArray[np.bool_]) -> Rate:
    return Rate(int(np.count_nonzero(hits)), int(hits.size))


def smallest_caught(caught: Callable[[float], float], power: float = POWER) -> float | None:
    """The smallest slowdown whose catch rate reaches ``power`` (the rate rises with the slowdown:
    the same draws are scaled, so the search is exact to 0.1 percentage point), else None."""
    # Most rows are caught below a doubling of step time: bracket there first, 4 halvings fewer.
    high = 1.0 if caught(1.0) >= power else MAX_SLOWDOWN
    if high == MAX_SLOWDOWN and caught(MAX_SLOWDOWN) < power:
        return None
    low = 0.0 if high == 1.0 else 1.0
    while high - low > 0.001:
        middle = (low + high) / 2
        low, high = (low, middle) if caught(middle) >= power else (middle, high)
    return high


def detectable(row: Row, rules: model.Rules, pairs: int | None = None, ab_tolerance: float = AB_REV_TOLERANCE,
               draws: int = 4000, seed: int = 0) -> float | None:  # fmt: skip
    """The smallest planted slowdown (0.12: steps take 12% longer) caught 9 times in 10: by the
    stored-baseline gate, or with ``pairs`` by ``ab-rev`` at ``ab_tolerance``. None: not even at 21x
    (a row whose spread is over the profile's CV limit is never judged)."""
    rng = np.random.default_rng(seed)
    if pairs is None:
        found = model.gate_draws(row, rules, rng, draws)
        return smallest_caught(lambda s: float(np.mean(model.gate_verdicts(found, row, rules, s) == model.REGRESSION)))
    paired = model.pair_draws(row, pairs, rng, draws)
    return smallest_caught(lambda s: float(np.mean(model.ab_verdicts(paired, ab_tolerance, s))))


def minimum_detectable(
    baseline: BaselineEntry, profile: HardwareProfile, pairs: int | None = None, noise: ProfileNoise | None = None,
    confirm: int = 1, ab_tolerance: float = AB_REV_TOLERANCE,
) -> float | None:  # fmt: skip
    """The smallest slowdown a scenario's gate catches 9 times in 10, from its own stored spread.

    ``pairs=None``: the stored-baseline gate with ``confirm`` confirmations; else ``ab-rev`` with that
    many pairs. A fraction of step time (0.25: steps 25% slower, throughput -20%); None where even a
    21x slowdown is not caught or the baseline stores no spread. ``noise`` defaults to the profile's
    measured components (see ``_noise_for`` where none were measured). About 30 ms.
    """
    row = _row(baseline, profile, noise)
    return None if row is None else detectable(row, model.Rules.of(profile, confirm), pairs, ab_tolerance)


def _row(baseline: BaselineEntry, profile: HardwareProfile, noise: ProfileNoise | None = None) -> Row | None:
    """The baseline's primary metric as a modelled row (None where it stores no usable mean)."""
    metric = primary_of(baseline)
    if metric is None or not float(baseline.metrics[metric].get("mean") or 0):
        return None
    return row_of(baseline, metric, profile, noise or _noise_for(profile))


def _noise_for(profile: HardwareProfile) -> ProfileNoise:
    """The profile's measured components; for a profile never measured, the H100's on a GPU and
    cpu's on cpu, the nearest machines whose spread was measured."""
    try:
        return noise_of(profile.name)
    except ValueError:
        return noise_of("nvidia-h100-80gb-hbm3-x1" if profile.device == "cuda" else "cpu")


#: The pairs of the ab-rev figure a recording names beside the gate's.
SAID_PAIRS = 3


def sensitivity(baseline: BaselineEntry, profile: HardwareProfile, confirm: int = 1) -> str:
    """What a just-recorded baseline lets its gate see, in words ("" without a stored spread): the smallest
    slowdown caught 9 times in 10 by the stored-baseline gate and by ``ab-rev`` with 3 pairs."""
    row = _row(baseline, profile)
    if row is None:
        return ""
    gate = detectable(row, model.Rules.of(profile, confirm))
    ab = detectable(row, model.Rules.of(profile, confirm), SAID_PAIRS, AB_REV_TOLERANCE)
    blind = (f"none at any size (its steps spread {row.step_cv:.0%} over {row.steps} steps: too many runs come out "
             f"unreliable against the profile's {profile.max_cv:.0%} limit; measure more steps)")  # fmt: skip
    return (f"caught 9 times in 10 (selftest --simulate's model of this row's spread): a slowdown of "
            f"{_said(gate) if gate is not None else blind} by this gate, {_said(ab)} by ab-rev with "
            f"{SAID_PAIRS} pairs")  # fmt: skip


def _said(slowdown: float | None) -> str:
    if slowdown is None:
        return f"none up to {MAX_SLOWDOWN:.0%}"
    return f"{slowdown:.0%} (throughput {-slowdown / (1 + slowdown):.0%})"
