"""Rates with their intervals, and the smallest slowdown a row's gate, or the sequential A/B on it,
catches 9 times in 10."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfsuite.core.profiles import HardwareProfile
from perfsuite.judge.sequential import REGRESSION, Design
from perfsuite.judge.simulate import model
from perfsuite.judge.simulate.noise import ProfileNoise, Row, min_effect_of, noise_of, primary_of, row_of
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
        from scipy import stats as scipy_stats  # 1 s of import: only where a rate is shown

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


def smallest_caught(caught: Callable[[float], float], power: float = POWER, guess: float = 1.0) -> float | None:
    """The smallest slowdown whose catch rate reaches ``power`` (the rate rises with the slowdown:
    the same draws are scaled, so the search is exact to 0.1 percentage point), else None.
    ``guess``: a slowdown likely caught, bracketed first so the halvings start from a short interval."""
    # Most rows are caught below a doubling of step time: bracket there first, 4 halvings fewer.
    low = 0.0
    for high in sorted({guess, 1.0, MAX_SLOWDOWN}):
        if caught(high) >= power:
            break
        low = high
    else:
        return None
    while high - low > 0.001:
        middle = (low + high) / 2
        low, high = (low, middle) if caught(middle) >= power else (middle, high)
    return high


def detectable(row: Row, rules: model.Rules, draws: int = 4000, seed: int = 0) -> float | None:
    """The smallest planted slowdown (0.12: steps take 12% longer) the stored-baseline gate catches 9
    times in 10. None: not even at 21x (a row whose spread is over the profile's CV limit is never
    judged)."""
    found = model.gate_draws(row, rules, np.random.default_rng(seed), draws)
    return smallest_caught(lambda s: float(np.mean(model.gate_verdicts(found, row, rules, s) == model.REGRESSION)))


@dataclass(frozen=True)
class Detected:
    """The smallest slowdown the sequential A/B calls a regression 9 times in 10, and its cost."""

    slowdown: float
    mean_pairs: float
    """Pairs spent on average at that slowdown (decided or not)."""


def ab_detectable(row: Row, design: Design, draws: int = 4000, seed: int = 0) -> Detected | None:
    """The sequential A/B's smallest slowdown decided ``regression`` 9 times in 10 on this row, with
    ``design`` (its minimum effect, levels and most pairs): undecided counts as not caught, so a row
    too noisy for its pairs says so here. None: not even at 21x."""
    paired = model.pair_draws(row, design.max_pairs, np.random.default_rng(seed), draws)

    def caught(slowdown: float) -> float:
        return float(np.mean(model.sequential_verdicts(paired, design, slowdown)[0] == REGRESSION))

    # At the minimum effect at most beta of the A/Bs pass, so most rows are caught there: bracket it first.
    found = smallest_caught(caught, guess=design.min_effect)
    if found is None:
        return None
    return Detected(found, float(np.mean(model.sequential_verdicts(paired, design, found)[1])))


def minimum_detectable(
    baseline: BaselineEntry,
    profile: HardwareProfile,
    pairs: int | None = None,
    noise: ProfileNoise | None = None,
    confirm: int = 1,
    min_effect: float | None = None,
) -> float | None:
    """The smallest slowdown a scenario's gate catches 9 times in 10, from its own stored spread.

    ``pairs=None``: the stored-baseline gate with ``confirm`` confirmations; else the sequential A/B
    (``ab-rev``, ``--perf-ab``) with at most that many pairs, against ``min_effect`` (default: the
    scenario's where its baseline records one, else the profile's); :func:`ab_minimum_detectable`
    also gives the pairs it spends. A fraction of step time (0.25: steps 25% slower, throughput
    -20%); None where even a 21x slowdown is not caught or the baseline stores no spread.
    ``noise`` defaults to the profile's measured components (see ``_noise_for`` where none were
    measured). 30-150 ms.
    """
    if pairs is not None:
        design = Design(min_effect or min_effect_of(baseline, profile)[0], max_pairs=pairs)
        found = ab_minimum_detectable(baseline, profile, design, noise)
        return None if found is None else found.slowdown
    row = row_for(baseline, profile, noise)
    return None if row is None else detectable(row, model.Rules.of(profile, confirm))


def ab_minimum_detectable(
    baseline: BaselineEntry, profile: HardwareProfile, design: Design | None = None, noise: ProfileNoise | None = None
) -> Detected | None:
    """The sequential A/B's smallest slowdown caught 9 times in 10 on a scenario, from its own stored
    spread, and the pairs that costs on average; ``design`` defaults to the A/B's (at most 8 pairs)
    at the scenario's minimum effect (its own where its baseline records one, else the profile's)."""
    row = row_for(baseline, profile, noise)
    if row is None:
        return None
    return ab_detectable(row, design or Design(min_effect_of(baseline, profile)[0]))


def row_for(baseline: BaselineEntry, profile: HardwareProfile, noise: ProfileNoise | None = None) -> Row | None:
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


def sensitivity(
    baseline: BaselineEntry, profile: HardwareProfile, confirm: int = 1, min_effect: float | None = None
) -> str:
    """What a just-recorded baseline lets its gate see, in words ("" without a stored spread): the
    smallest slowdown caught 9 times in 10 by the stored-baseline gate and by the sequential A/B
    (``ab-rev``, ``--perf-ab``) of the default design, with the pairs that A/B spends on average.
    ``min_effect``: the scenario's own (default: recorded in its baseline, else the profile's)."""
    row = row_for(baseline, profile)
    if row is None:
        return ""
    gate = detectable(row, model.Rules.of(profile, confirm))
    effect, whose = (min_effect, "the scenario's") if min_effect is not None else min_effect_of(baseline, profile)
    design = Design(effect)
    ab = ab_detectable(row, design)
    blind = (
        f"none at any size (its steps spread {row.step_cv:.0%} over {row.steps} steps: too many runs come out "
        f"unreliable against the profile's {profile.max_cv:.0%} limit; measure more steps)"
    )
    caught, spent = (ab.slowdown, f" in {ab.mean_pairs:.1f} pairs on average") if ab is not None else (None, "")
    return (
        f"caught 9 times in 10 (selftest --simulate's model of this row's spread): a slowdown of "
        f"{_said(gate) if gate is not None else blind} by this gate, {_said(caught)} by the sequential A/B "
        f"(ab-rev, --perf-ab){spent} (at most {design.max_pairs}; minimum effect {share(effect)}, {whose})"
    )


def _said(slowdown: float | None) -> str:
    if slowdown is None:
        return f"none up to {MAX_SLOWDOWN:.0%}"
    return f"{share(slowdown)} (throughput {share(-slowdown / (1 + slowdown))})"


def share(x: float) -> str:
    """A fraction as percent, with a decimal where it is small (2.3%, 95%)."""
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"
