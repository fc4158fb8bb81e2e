"""E-divisive means change-point detection over one metric's history.

The method Apache Otava (formerly Hunter) and MongoDB's CI use on performance
histories: Matteson & James, "A Nonparametric Approach for Multiple Change
Point Analysis of Multivariate Data", JASA 109 (2014), with the significance
of each split found by a permutation test; applied to CI benchmarks in Daly et
al., "The Use of Change Point Detection to Identify Software Performance
Regressions in a Continuous Integration System", ICPE 2020.

Hand-written on numpy because the library implementations do not install
beside this stack (docs/design/changepoint.md has the comparison and its
figures): MongoDB's ``signal-processing-algorithms`` 2.1.6 is an sdist for
Python 3.11 only that pins numpy<2 and setuptools<71 and pulls in gevent;
``apache-otava`` 0.8.0 pins numpy==2.2.0.* and scipy<1.17 (the GPU image has
numpy 2.5.2, scipy 1.18.1) and pulls in Google Cloud, Postgres and Slack
clients, 43 packages. On the same series this module finds what Otava's
permutation-tested e-divisive finds. The algorithm is short:

1. For a segment ``Z`` and every split ``tau`` and end ``kappa``, the energy
   distance between ``X = Z[:tau]`` and ``Y = Z[tau:kappa]``, scaled by the sizes,
   ``Q(tau, kappa) = tau (kappa - tau) / kappa * (2 E|X - Y|^a - E|X - X'|^a - E|Y - Y'|^a)``;
   the split's statistic is its largest over ``kappa``.
2. The best split of every current segment; the largest ``Q`` is the candidate.
3. Its significance: the same maximum over permutations of the observations
   within each current segment; ``p = (1 + #{Q_perm >= Q}) / (1 + R)``.
4. Accept it if ``p <= max_p`` and repeat on the finer segmentation, else stop.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]


@dataclass(frozen=True)
class Split:
    """A significant change: ``values[index:]`` differ from what precedes them."""

    index: int
    p_value: float
    statistic: float


def e_divisive(
    values: Sequence[float],
    *,
    max_p: float = 0.01,
    permutations: int = 499,
    min_size: int = 3,
    alpha: float = 1.0,
    seed: int = 0,
) -> list[Split]:
    """Change points of ``values`` by e-divisive means, sorted by index.

    ``min_size`` is the fewest points a segment may have (>= 2: a segment's
    spread needs two); ``alpha`` in (0, 2) is the distance exponent (1 detects
    shifts of the mean and of the distribution). A fixed ``seed`` makes the
    permutation test, and so the answer, reproducible.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("e_divisive needs a flat sequence of finite numbers")
    if min_size < 2 or not 0 < alpha < 2 or permutations < 1:
        raise ValueError("e_divisive needs min_size >= 2, 0 < alpha < 2 and permutations >= 1")
    rng = np.random.default_rng(seed)
    bounds = [0, len(x)]
    found: list[Split] = []
    while True:
        statistic, index = _best_split(x, bounds, alpha, min_size)
        if index < 0 or statistic <= 0:
            break
        p_value = _permutation_p(x, bounds, statistic, rng, permutations, max_p, alpha, min_size)
        if p_value > max_p:
            break
        found.append(Split(index, p_value, statistic))
        bounds = sorted([*bounds, index])
    return sorted(found, key=lambda s: s.index)


def _best_split(x: Floats, bounds: Sequence[int], alpha: float, min_size: int) -> tuple[float, int]:
    """The largest Q over every segment's splits and where it is (-1: no segment can split)."""
    best, where = 0.0, -1
    for start, end in itertools.pairwise(bounds):
        q = q_values(x[start:end], alpha, min_size)
        if q.size and float(q.max()) > best:
            best, where = float(q.max()), start + min_size + int(q.argmax())
    return best, where


def q_values(segment: Floats, alpha: float, min_size: int) -> Floats:
    """For tau = min_size .. m - min_size, the largest Q(tau, kappa) over the ends
    kappa of the right part ``Y = Z[tau:kappa]`` (kappa - tau >= min_size), as
    Matteson & James define the statistic: a change that a later one reverts
    within the segment (a dip, or 100 -> 80 -> 95) stands out as well as a step.
    All pairs from 2-D prefix sums of the distance matrix, O(m^2)."""
    m = len(segment)
    if m < 2 * min_size:
        return np.empty(0)
    distances = np.abs(segment[:, None] - segment[None, :]) ** alpha
    prefix = np.zeros((m + 1, m + 1))
    prefix[1:, 1:] = distances.cumsum(0).cumsum(1)
    diagonal = np.diagonal(prefix)  # diagonal[i]: sum over Z[:i] x Z[:i]
    tau = np.arange(min_size, m - min_size + 1)[:, None]
    kappa = np.arange(2 * min_size, m + 1)[None, :]
    valid = kappa - tau >= min_size
    rest = np.where(valid, kappa - tau, 2)  # |Y|; 2 where (tau, kappa) is no split, masked below
    within_left = diagonal[tau]  # sum over X x X
    corner = prefix[tau, kappa]  # sum over Z[:tau] x Z[:kappa]
    between = corner - within_left  # sum over X x Y
    within_right = diagonal[kappa] - 2 * corner + within_left  # sum over Y x Y (symmetric matrix)
    energy = 2 * between / (tau * rest) - within_left / (tau * (tau - 1)) - within_right / (rest * (rest - 1))
    q: Floats = np.where(valid, tau * rest / kappa * energy, -np.inf).max(axis=1)
    return q


def _permutation_p(
    x: Floats,
    bounds: Sequence[int],
    statistic: float,
    rng: np.random.Generator,
    permutations: int,
    max_p: float,
    alpha: float,
    min_size: int,
) -> float:
    """Permutation p-value of ``statistic``; stops early (returning a value
    above ``max_p``) once the split can no longer be significant."""
    exceed = 0
    give_up = max_p * (permutations + 1) - 1  # more exceedances than this: p > max_p
    shuffled = x.copy()
    for _ in range(permutations):
        for start, end in itertools.pairwise(bounds):
            shuffled[start:end] = rng.permutation(x[start:end])
        exceed += _best_split(shuffled, bounds, alpha, min_size)[0] >= statistic
        if exceed > give_up:
            return (exceed + 1) / (permutations + 1)
    return (exceed + 1) / (permutations + 1)
