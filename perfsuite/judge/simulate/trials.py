"""The trials committed so far, and how likely the model finds what they saw.

Whole histories are simulated: each session draws one offset that every trial and baseline
recorded in it shares (a card or VM state hits every row measured that day), each baseline is drawn
once, then every trial. What the trials saw is then a tail probability of the model: the count of
failures, and at 0% the worst drop any trial read. A tail under 5% rejects the model.

The ``ab`` trials ran the A/B of their day, a fixed number of pairs judged by a paired t-test
against a tolerance, so they are modelled by that rule (``model.fixed_ab_verdicts``), not by the
sequential A/B that replaced it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from perfsuite.judge.simulate import model
from perfsuite.judge.simulate.noise import Row

#: A tail probability under this says the model cannot explain what the trials saw.
REJECT_BELOW = 0.05


@dataclass(frozen=True)
class Trials:
    """Trials of one row at one planted slowdown in one session, as committed."""

    profile: str
    scenario: str
    level: float
    """Planted slowdown, a fraction of step time."""
    trials: int
    failed: int
    session: str
    baseline_session: str
    source: str
    mode: Literal["gate", "ab"] = "gate"
    pairs: int = 0
    """``ab``: the fixed number of pairs the old A/B ran."""
    ab_tolerance: float = 0.0
    """``ab``: the old A/B's tolerance (a significant loss beyond it failed)."""
    worst: float | None = None
    """The most negative change a 0% trial read, where it was kept."""


CPU_TRUST = "docs/trust.md, 'Measured on the cpu profile'"
CPU_AB = "docs/trust.md, 'A/B of two stacks' (--perf-ab, 4 pairs, tolerance 5%)"
CPU_AB_REV = "docs/lab/drift/ab-rev-detection-2026-11-26.txt (ab-rev, 3 pairs, tolerance 10%)"
H100_S1 = "docs/gpu-runs/2026-11-26-nvidia-h100-x1/selftest_microbench.device_copy.json"
H100_S3 = "docs/gpu-runs/2026-11-26-nvidia-h100-x1-op-profiles/README.md"
H100_S4 = "docs/gpu-runs/2026-11-26-nvidia-h100-x1-session4/selftest_*.json"
H200_S1 = "docs/gpu-runs/2026-11-26-nvidia-h200-x1/selftest_microbench.device_copy.json"
H100 = "nvidia-h100-80gb-hbm3-x1"
#: The bootstrap's selftest on a GPU: 2 trials at 0, 3, 5 and 10%, (level %, trials, failed).
DETECTION = [(0.0, 2, 0), (3.0, 2, 2), (5.0, 2, 2), (10.0, 2, 2)]


def _levels(
    profile: str,
    scenario: str,
    session: str,
    baseline: str,
    source: str,
    counts: Sequence[tuple[float, int, int]],
    worst: float | None = None,
) -> list[Trials]:
    return [
        Trials(profile, scenario, pct / 100, n, k, session, baseline, source, worst=None if pct else worst)
        for pct, n, k in counts
    ]


def _ab(
    scenario: str,
    pairs: int,
    tolerance: float,
    source: str,
    counts: Sequence[tuple[float, int, int]],
    worst: float | None = None,
) -> list[Trials]:
    found = [
        Trials("cpu", scenario, pct / 100, n, k, "ab", "ab", source, "ab", pairs, tolerance) for pct, n, k in counts
    ]
    return [Trials(**{**t.__dict__, "worst": worst if t.level == 0 else None}) for t in found]


COMMITTED: tuple[Trials, ...] = (
    *_levels(
        "cpu",
        "mixed_precision.fp32",
        "cpu-trust-1",
        "cpu-recording",
        CPU_TRUST,
        [(0, 10, 0), (50, 10, 0), (75, 10, 9), (100, 10, 10), (200, 10, 10)],
    ),
    *_levels("cpu", "mixed_precision.fp32", "cpu-trust-2", "cpu-recording", CPU_TRUST, [(0, 10, 0)]),
    *_ab("mixed_precision.fp32", 4, 0.05, CPU_AB, [(0, 10, 0), (10, 10, 5), (20, 10, 10)]),
    *_ab("mixed_precision.amp", 3, model.FIXED_AB_REV_TOLERANCE, CPU_AB_REV, [(0, 10, 0), (20, 10, 10)], worst=-0.030),
    # The first session recorded the copy's and BERT fine-tuning's baselines; the fourth the T5 layer's.
    *_levels(H100, "microbench.device_copy", "h100-1", "h100-1", H100_S1, DETECTION, worst=0.00046),
    *_levels(H100, "microbench.device_copy", "h100-3", "h100-1", H100_S3, DETECTION),
    Trials(H100, "microbench.t5_decoder_layer_fwd", 0.0, 2, 0, "h100-4", "h100-4", H100_S4, worst=0.00046),
    Trials(H100, "graph_optimization.amp", 0.0, 2, 2, "h100-4", "h100-1", H100_S4, worst=-0.13901),
    *_levels("nvidia-h200-x1", "microbench.device_copy", "h200-1", "h200-1", H200_S1, DETECTION),
)


@dataclass(frozen=True)
class Simulated:
    """One committed entry, simulated over many histories."""

    trials: Trials
    failed: NDArray[np.int64]
    """Failures in each history."""
    worst: NDArray[np.float64]
    """The most negative change each history's trials read."""

    def tail(self) -> float:
        """P(as many failures or more | model) where they saw more than it expects, else P(as few or fewer)."""
        k = self.trials.failed
        more = k >= self.failed.mean()
        return float(np.mean(self.failed >= k) if more else np.mean(self.failed <= k))


def simulate(
    trials: Sequence[Trials], rows: Callable[[Trials], Row], rules: model.Rules, histories: int, seed: int = 0
) -> list[Simulated]:
    """Every entry over ``histories`` histories sharing session offsets and baselines as they did."""
    rng = np.random.default_rng(seed)
    offsets: dict[str, model.Array] = {}
    bases: dict[tuple[str, str], model.Summaries] = {}
    found = []
    for t in trials:
        row = rows(t)
        if t.mode == "ab":
            paired = model.pair_draws(row, t.pairs, rng, histories * t.trials)
            hits = model.fixed_ab_verdicts(paired, t.ab_tolerance, t.level).reshape(histories, t.trials)
            before, after = paired.at(t.level)
            change = (after / before - 1).mean(axis=1).reshape(histories, t.trials)
            found.append(Simulated(t, hits.sum(axis=1), change.min(axis=1)))
            continue
        for session in (t.session, t.baseline_session):
            offsets.setdefault(session, model.session_offsets(row, rng, histories))
        base = bases.setdefault((t.scenario, t.baseline_session), model.pooled(row, offsets[t.baseline_session], rng))
        draws = model.GateDraws(
            model.Summaries(np.repeat(base.mean, t.trials), np.repeat(base.std, t.trials), base.n),
            model.runs(row, rules, rng, np.repeat(offsets[t.session], t.trials)),
        )
        hits = model.gate_verdicts(draws, row, rules, t.level) == model.REGRESSION
        change = model.final_delta(draws, row, rules, t.level).reshape(histories, t.trials)
        found.append(Simulated(t, hits.reshape(histories, t.trials).sum(axis=1), change.min(axis=1)))
    return found


@dataclass(frozen=True)
class FalseAlarms:
    """Every 0% trial of one mode on one profile, pooled."""

    trials: int
    failed: int
    per_trial: float
    """The model's false-alarm rate a trial, over these trials."""
    tail: float
    """P(this many false alarms or more | model)."""
    worst: float | None
    worst_tail: float | None
    """P(some trial reads ``worst`` or lower | model)."""


def false_alarms(simulated: Sequence[Simulated]) -> FalseAlarms | None:
    zero = [s for s in simulated if s.trials.level == 0]
    if not zero:
        return None
    trials, failed = sum(s.trials.trials for s in zero), sum(s.trials.failed for s in zero)
    counts = np.sum([s.failed for s in zero], axis=0)
    kept = [s for s in zero if s.trials.worst is not None]
    worst = min((s.trials.worst for s in kept if s.trials.worst is not None), default=None)
    worst_tail = None
    if worst is not None:
        # Only the trials that kept their readings can show a worst one.
        worst_tail = float(np.mean(np.min([s.worst for s in kept], axis=0) <= worst))
    return FalseAlarms(
        trials, failed, float(counts.mean()) / trials, float(np.mean(counts >= failed)), worst, worst_tail
    )
