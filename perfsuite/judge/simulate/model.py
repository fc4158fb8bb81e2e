"""The vectorised model: many draws of one row, judged by the gate's rules in numpy, and by the
sequential A/B's own vectorised decision (``sequential.decide``).

A launch's per-step rates are normal around the launch's level, which is the true value times
(1 + the session's offset) times (1 + the launch's offset), over (1 + the planted slowdown). Its
mean and standard deviation are drawn directly (a normal mean and a chi-square spread: exactly
what ``Summary.of`` of its steps would give). The stored baseline pools its launches as
``stats.pool`` does. A run is one launch; each confirmation is a fresh launch in the run's session,
so it shares that session's offset. The A/B pairs launches within one session, whose offset then
cancels in each pair's ratio, so a pair is two fresh launch means. Contention, throttling and
processor changes are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import stdtr

from perfsuite.core.profiles import HardwareProfile
from perfsuite.judge.abtest import ALPHA as AB_ALPHA
from perfsuite.judge.compare import ALPHA
from perfsuite.judge.judging import SPREAD_GROWTH_FLOOR
from perfsuite.judge.sequential import Design, decide
from perfsuite.judge.simulate.noise import Row
from perfsuite.judge.stats import welch_p_below

Array = NDArray[np.float64]
PASS, REGRESSION, UNRELIABLE = 0, 1, 2


@dataclass(frozen=True)
class Summaries:
    """Means, standard deviations (same shape) and the sample count of each."""

    mean: Array
    std: Array
    n: int

    def scaled(self, factor: float) -> Summaries:
        return Summaries(self.mean * factor, self.std * factor, self.n)


@dataclass(frozen=True)
class Rules:
    """The gate's settings that decide a verdict, from the profile and the session's settings."""

    max_cv: float
    spread_growth: float | None
    confirm: int = 1
    family_rows: int = 1
    """Rows whose timing the run judges: a row fails only beyond the family's floor too
    (``Row.judged_tolerance``)."""

    @classmethod
    def of(cls, profile: HardwareProfile, confirm: int = 1, family_rows: int = 1) -> Rules:
        return cls(profile.max_cv, profile.max_spread_growth, confirm, family_rows)


def launches(row: Row, level: Array, rng: np.random.Generator, shape: tuple[int, ...]) -> Summaries:
    """One launch per element of ``shape`` at ``level`` (broadcast): its steps' mean and spread."""
    centre = level * (1 + row.launch_cv * rng.standard_normal(shape))
    sd = centre * row.step_cv
    mean = centre + sd / np.sqrt(row.steps) * rng.standard_normal(shape)
    std = sd * np.sqrt(rng.chisquare(row.steps - 1, shape) / (row.steps - 1))
    return Summaries(mean, std, row.steps)


def pooled(row: Row, offset: Array, rng: np.random.Generator) -> Summaries:
    """The stored baseline: ``row.baseline_launches`` launches of one session, pooled step by step."""
    count = row.baseline_launches
    each = launches(row, (1 + offset)[:, None], rng, (offset.size, count))
    mean = each.mean.mean(axis=1)
    within = (each.n - 1) * each.std**2
    between = each.n * (each.mean - mean[:, None]) ** 2
    total = count * each.n
    return Summaries(mean, np.sqrt((within + between).sum(axis=1) / (total - 1)), total)


def session_offsets(row: Row, rng: np.random.Generator, size: int) -> Array:
    return row.session_cv * rng.standard_normal(size)


def welch_p_less(run: Summaries, base: Summaries) -> Array:
    """``compare.worse_p_value``'s one-sided Welch test, element by element."""
    return welch_p_below(run.mean, run.std, run.n, base.mean, base.std, base.n)


def judge(base: Summaries, run: Summaries, tolerance: float, rules: Rules) -> NDArray[np.int64]:
    """``judging.against`` on a higher-is-better primary metric, element by element."""
    cv = run.std / run.mean
    delta = (run.mean - base.mean) / base.mean
    p = welch_p_less(run, base)
    # compare.check_metric: an untestable p (no spread on either side) counts as significant.
    regression = (-delta > tolerance) & (~np.isfinite(p) | (p < ALPHA))
    grew = np.zeros_like(regression)
    if rules.spread_growth is not None:
        grew = cv > np.maximum(rules.spread_growth * base.std / base.mean, SPREAD_GROWTH_FLOOR)
    verdict = np.where(regression, np.where(grew, UNRELIABLE, REGRESSION), PASS)
    return np.where(cv > rules.max_cv, UNRELIABLE, verdict)


def confirmed(verdicts: Sequence[NDArray[np.int64]]) -> NDArray[np.int64]:
    """session.PerfSession._run's loop: a regression stands only if every confirmation regresses
    too; the first that does not gives the verdict."""
    final = verdicts[0].copy()
    open_ = final == REGRESSION
    for later in verdicts[1:]:
        final = np.where(open_, later, final)
        open_ &= later == REGRESSION
    return final


@dataclass(frozen=True)
class GateDraws:
    """``size`` stored-baseline runs of one row: the baseline and each attempt's launch."""

    base: Summaries
    attempts: tuple[Summaries, ...]

    def at(self, slowdown: float) -> tuple[Summaries, ...]:
        """The attempts with ``slowdown`` planted (rates scale with it, CVs do not)."""
        return tuple(a.scaled(1 / (1 + slowdown)) for a in self.attempts)


def runs(row: Row, rules: Rules, rng: np.random.Generator, offset: Array) -> tuple[Summaries, ...]:
    """A run and its confirmations: fresh launches in the sessions of ``offset``."""
    return tuple(launches(row, 1 + offset, rng, offset.shape) for _ in range(1 + rules.confirm))


def gate_draws(
    row: Row, rules: Rules, rng: np.random.Generator, size: int, sessions: tuple[Array, Array] | None = None
) -> GateDraws:
    """``size`` runs, each against its own baseline recorded in another session. ``sessions``: the
    baseline's and the run's session draws (standard normal, ``size`` each) that every row of one
    run shares; drawn here when not given."""
    base_offset = row.session_cv * sessions[0] if sessions is not None else session_offsets(row, rng, size)
    base = pooled(row, base_offset, rng)
    run_offset = row.session_cv * sessions[1] if sessions is not None else session_offsets(row, rng, size)
    return GateDraws(base, runs(row, rules, rng, run_offset))


def gate_verdicts(draws: GateDraws, row: Row, rules: Rules, slowdown: float) -> NDArray[np.int64]:
    tolerance = row.judged_tolerance(rules.family_rows)
    return confirmed([judge(draws.base, a, tolerance, rules) for a in draws.at(slowdown)])


def final_delta(draws: GateDraws, row: Row, rules: Rules, slowdown: float) -> Array:
    """The change the verdict rests on (the last attempt taken), as ``selftest`` records it."""
    attempts = draws.at(slowdown)
    tolerance = row.judged_tolerance(rules.family_rows)
    taken = np.zeros(draws.base.mean.shape, dtype=np.int64)
    open_ = judge(draws.base, attempts[0], tolerance, rules) == REGRESSION
    for k, attempt in enumerate(attempts[1:], 1):
        taken = np.where(open_, k, taken)
        open_ &= judge(draws.base, attempt, tolerance, rules) == REGRESSION
    means = np.stack([a.mean for a in attempts])
    return np.take_along_axis(means, taken[None, :], 0)[0] / draws.base.mean - 1


@dataclass(frozen=True)
class PairDraws:
    """``size`` A/Bs of ``pairs`` pairs: each launch's value (shape size x pairs), base and candidate."""

    base: Array
    candidate: Array

    def at(self, slowdown: float) -> tuple[Array, Array]:
        """The pairs with ``slowdown`` planted: the candidate's throughput over (1 + slowdown)."""
        return self.base, self.candidate / (1 + slowdown)


def pair_draws(row: Row, pairs: int, rng: np.random.Generator, size: int) -> PairDraws:
    one = launches(row, np.ones((size, pairs)), rng, (size, pairs)).mean
    other = launches(row, np.ones((size, pairs)), rng, (size, pairs)).mean
    return PairDraws(one, other)


def sequential_verdicts(
    draws: PairDraws, design: Design, slowdown: float
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The sequential A/B of each draw with ``slowdown`` planted: its decision code
    (``sequential.DECISIONS``) and the pairs it spent. The A/B's own ``decide`` on the losses
    ``log(base / candidate)``, which is ``log(base / candidate) + log(1 + slowdown)`` of the
    unslowed draw, computed as ``Trial.look`` computes them so the real code agrees draw for draw."""
    if draws.base.shape[1] != design.max_pairs:
        raise ValueError(f"need draws of {design.max_pairs} pairs (the design's most), got {draws.base.shape[1]}")
    base, candidate = draws.at(slowdown)
    return decide(design, np.log(base / candidate))


#: The fixed-n ``ab-rev`` that the committed ``ab`` trials ran, before the A/B became sequential:
#: 3 pairs (``--pairs``), a one-sided paired t-test, a regression where it was significant
#: (p < 0.05) and the candidate lost more than this. Only those historical trials are judged so.
FIXED_AB_REV_TOLERANCE = 0.10


def fixed_ab_verdicts(draws: PairDraws, tolerance: float, slowdown: float) -> NDArray[np.bool_]:
    """The old fixed-n A/B's rule (``abtest.compare`` on throughput over all the pairs), trial by
    trial: a significant loss beyond ``tolerance``. Kept for the committed trials that ran it."""
    base, candidate = draws.at(slowdown)
    ratios = candidate / base - 1
    pairs = ratios.shape[1]
    mean = ratios.mean(axis=1)
    # abtest.compare's one-sample t-test of the ratios against 0, as a ufunc.
    with np.errstate(divide="ignore", invalid="ignore"):
        p = stdtr(pairs - 1, mean / (ratios.std(axis=1, ddof=1) / np.sqrt(pairs)))
    return np.asarray((p < AB_ALPHA) & (-mean > tolerance))
