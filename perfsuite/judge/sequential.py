"""Sequential A/B: after each pair of launches, ``regression``, ``pass`` or one more pair.

The data are the pairs' losses, ``log(base / candidate)`` of a higher-is-better headline metric
(``log(candidate / base)`` of a lower-is-better one): 0 when the candidate is as fast, ``log(1 + m)``
when its steps take ``m`` longer. The team states the smallest slowdown it cares about, the
minimum effect ``m``, and two one-sided repeated t-tests run on the same pairs:

* **regression** -- "no slowdown" (mean loss <= 0) is rejected at a look whose nominal p-value is
  under ``levels.regression``;
* **pass** -- "a slowdown of ``m`` or more" (mean loss >= ``log(1 + m)``) is rejected at a look
  whose nominal p-value is under ``levels.passing``.

The first look where either rejects decides (both at once: a slowdown that is real but below
``m``, a pass). With neither by ``max_pairs`` (or the caller's time budget) the A/B is
``undecided``. The nominal levels are a Pocock-style repeated significance test: the look-to-look
minimum of the t-test's p-value over looks ``first_look..max_pairs`` has one distribution under
its null hypothesis whatever the noise (each t statistic is pivotal for normal losses), so its
``alpha`` quantile, computed once by simulation, keeps "regression at 0%" at most ``alpha`` and
its ``beta`` quantile keeps "pass at ``m``" at most ``beta``, over every look and whatever pair
the A/B stops at. Stopping early for the other test only lowers either rate, so both are upper
bounds; the pooled figures at a profile's modelled noise are in ``selftest --simulate``. The
interval reported is the decision's own: its lower end at the regression level, its upper end at
the pass level, so ``regression`` is "the interval is above 0" and ``pass`` "it is below the
minimum effect". Both ends hold at every look at once, so it covers the true slowdown with at
least ``1 - alpha - beta`` (85%) wherever the A/B stopped.

Assumptions (``docs/trust.md``): pairs are independent and their losses normal with one mean and
one spread. Alternating which side runs first in a pair (the callers do) turns a steady
first/second-launch bias into spread rather than a false effect. Torch-free; numpy and scipy are
imported on first use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

Decision = Literal["regression", "pass", "undecided", "continue"]
#: Decision codes of the vectorised form (``decide``), in this order.
DECISIONS: tuple[Decision, ...] = ("continue", "regression", "pass", "undecided")
CONTINUE, REGRESSION, PASS, UNDECIDED = range(4)
#: Simulated look sequences behind the nominal levels: their alpha = 5% quantile moves by about
#: 1% of itself between seeds.
SIMS = 200_000
SEED = 20261128
ALPHA, BETA, MAX_PAIRS, FIRST_LOOK = 0.05, 0.10, 8, 2
#: The most pairs a design may plan (the levels' simulation grows with it).
MOST_PAIRS = 200


@dataclass(frozen=True)
class Levels:
    """The nominal one-sided p-value each look is compared with."""

    regression: float
    passing: float


@dataclass(frozen=True)
class Design:
    """What a sequential A/B promises: at 0% slowdown ``regression`` at most ``alpha`` of the time,
    at ``min_effect`` ``pass`` at most ``beta`` of the time, within ``max_pairs`` pairs."""

    min_effect: float
    """The smallest slowdown the team cares about: 0.02 = steps take 2% longer."""
    alpha: float = ALPHA
    beta: float = BETA
    max_pairs: int = MAX_PAIRS
    first_look: int = FIRST_LOOK
    """The first pair count that may decide; a t-test needs 2."""

    def __post_init__(self) -> None:
        if isinstance(self.min_effect, bool) or not (
            isinstance(self.min_effect, (int, float)) and 0 < self.min_effect < 10
        ):
            raise ValueError(f"min_effect must be a slowdown fraction above 0 (0.02 = 2%), got {self.min_effect!r}")
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not 0 < value < 0.5:
                raise ValueError(f"{name} must be in (0, 0.5), got {value!r}")
        if not 2 <= self.first_look <= self.max_pairs <= MOST_PAIRS:
            raise ValueError(
                f"need 2 <= first_look <= max_pairs <= {MOST_PAIRS}, got first_look={self.first_look}, max_pairs={self.max_pairs}"
            )

    @property
    def margin(self) -> float:
        """The minimum effect as a loss: ``log(1 + min_effect)``."""
        return math.log1p(self.min_effect)

    def levels(self) -> Levels:
        return nominal_levels(self.max_pairs, self.first_look, self.alpha, self.beta)


@dataclass(frozen=True)
class State:
    """The A/B after ``pairs`` pairs."""

    pairs: int
    slowdown: float
    """The estimate: ``exp(mean loss) - 1`` (+0.05: the candidate's steps take 5% longer)."""
    low: float
    high: float
    """The decision's interval of the slowdown: above 0 is a regression, below the minimum effect a
    pass; it holds at every look at once (infinite before 2 pairs)."""
    decision: Decision
    decided_at: int
    """The pair count that decided (0 while undecided)."""

    def interval(self, design: Design) -> str:
        """The decision's interval in words, with the coverage it holds at every look."""
        if not math.isfinite(self.low):
            return "no interval yet"
        return f"{1 - design.alpha - design.beta:.0%} CI {self.low:+.1%} .. {self.high:+.1%}"

    def describe(self, design: Design) -> str:
        return (
            f"slowdown {self.slowdown:+.1%} ({self.interval(design)}), {self.decision} after {self.pairs} pair(s) "
            f"of at most {design.max_pairs}; minimum effect {design.min_effect:.1%}"
        )


@functools.lru_cache(maxsize=32)
def nominal_levels(max_pairs: int, first_look: int, alpha: float, beta: float) -> Levels:
    """The nominal levels whose repeated use over looks ``first_look..max_pairs`` keeps the overall
    rates at ``alpha`` and ``beta``: quantiles of the smallest p-value over the looks, for standard
    normal losses (every t statistic is pivotal, so any mean and spread give the same)."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    smallest = _p_greater(rng.standard_normal((SIMS, max_pairs)), 0.0)[:, first_look - 1 :].min(axis=1)
    found = np.quantile(smallest, (alpha, beta))
    return Levels(float(found[0]), float(found[1]))


def _t(losses: NDArray[np.float64], centre: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each look's t statistic of ``mean - centre`` and its degrees of freedom (looks along axis 1)."""
    import numpy as np

    n = np.arange(1, losses.shape[1] + 1, dtype=np.float64)
    mean = np.cumsum(losses, axis=1) / n
    squares = np.cumsum((losses - losses[:, :1]) ** 2, axis=1) - n * (mean - losses[:, :1]) ** 2
    sd = np.sqrt(np.maximum(squares, 0.0) / np.maximum(n - 1, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (mean - centre) / (sd / np.sqrt(n))
    # No spread (identical losses): the sign decides, as a t of +-inf; no difference at all, t = 0.
    apart = mean - centre
    flat = np.where(apart > 0, np.inf, np.where(apart < 0, -np.inf, 0.0))
    return np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mean)), t, flat), np.maximum(n - 1, 1)


def _p_greater(losses: NDArray[np.float64], centre: float) -> NDArray[np.float64]:
    """Each look's one-sided t-test p-value of "mean loss > centre" (1 at the first look)."""
    import numpy as np
    from scipy.special import stdtr

    t, df = _t(losses, centre)
    p = stdtr(df, -t)
    p[:, 0] = 1.0
    return np.asarray(p)


def decide(design: Design, losses: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each row of ``losses`` (one A/B's pairs in order, up to ``max_pairs``) as the sequential A/B
    judges it: the decision code (``DECISIONS``) and the pairs it spent. Rows shorter than
    ``max_pairs`` that decide nothing are ``CONTINUE``."""
    import numpy as np

    levels, looks = design.levels(), losses.shape[1]
    regression = _p_greater(losses, 0.0) < levels.regression
    passing = _p_greater(-losses, -design.margin) < levels.passing
    early = np.arange(looks) < design.first_look - 1
    regression[:, early], passing[:, early] = False, False
    either = regression | passing
    first = np.where(either.any(axis=1), either.argmax(axis=1), looks)
    rows, at = np.arange(losses.shape[0]), np.minimum(first, looks - 1)
    decided = first < looks
    code = np.where(passing[rows, at], PASS, REGRESSION)  # both at once: real but below the minimum effect
    out_of_pairs = UNDECIDED if looks >= design.max_pairs else CONTINUE
    code = np.where(decided, code, out_of_pairs)
    return code.astype(np.int64), np.where(decided, first + 1, looks).astype(np.int64)


def assess(design: Design, losses: Sequence[float], final: bool = False) -> State:
    """The A/B on the pairs so far (at most ``max_pairs``): its decision, or ``continue``
    (``undecided`` when ``final``: no more pairs will come, as when a time budget ran out)."""
    import numpy as np
    from scipy.special import stdtrit

    if not 1 <= len(losses) <= design.max_pairs:
        raise ValueError(f"an A/B look needs 1 to {design.max_pairs} pairs, got {len(losses)}")
    row = np.asarray(losses, dtype=np.float64)[None, :]
    code, spent = decide(design, row)
    decision = DECISIONS[int(code[0])]
    if decision == "continue" and final:
        decision = "undecided"
    kept = row[:, : int(spent[0])] if decision in ("regression", "pass") else row
    n = kept.shape[1]
    mean = float(kept.mean())
    low, high = -math.inf, math.inf
    if n > 1:
        se, levels = float(kept.std(ddof=1)) / math.sqrt(n), design.levels()
        low = math.expm1(mean - float(stdtrit(n - 1, 1 - levels.regression)) * se)
        high = math.expm1(mean + float(stdtrit(n - 1, 1 - levels.passing)) * se)
    decided_at = n if decision in ("regression", "pass") else 0
    return State(n, math.expm1(mean), low, high, decision, decided_at)


def loss(base: float, candidate: float, higher_is_better: bool) -> float:
    """One pair's loss: positive when the candidate is worse, ``log(1 + m)`` at a slowdown ``m``."""
    return math.log(base / candidate) if higher_is_better else math.log(candidate / base)


def base_first(pair: int) -> bool:
    """Which side runs first in pair ``pair`` (0-based): the base, then the candidate, alternately
    (ABBA...), so a first-of-two bias cancels over two pairs instead of reading as an effect."""
    return pair % 2 == 0
