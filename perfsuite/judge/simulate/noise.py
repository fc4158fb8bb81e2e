"""The measured variance components of each profile, and of one row from its baseline.

Every figure names the committed data it comes from; ``tests/test_simulate.py``
recomputes the cpu and H100 ones from those files, so a table that drifts from
the data fails there. All figures are relative (coefficients of variation).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from perfsuite.core.profiles import HardwareProfile
from perfsuite.judge.calibration import tolerance
from perfsuite.judge.compare import FAMILY_ALPHA, resolve_tolerances
from perfsuite.store.baselines import BaselineEntry


@dataclass(frozen=True)
class Figure:
    """One measured figure and where it was measured."""

    value: float
    source: str


@dataclass(frozen=True)
class ProfileNoise:
    """The variance components of a typical row of one profile."""

    profile: str
    aliases: tuple[str, ...]
    step_cv: Figure
    """Step to step within one launch."""
    launch_cv: Figure
    """Launch to launch within one session, beyond the step noise of the launch's mean."""
    session_cv: Figure
    """Each session's own offset (the machine's, the card's state that day): shared by every launch
    of the session, so a confirmation relaunch does not escape it."""
    steps: int
    """Measured steps of a typical launch."""
    baseline_launches: int
    """Launches pooled into a typical stored baseline (calibration runs 3)."""


#: sigma of one session's offset, from the RMS difference between two sessions' measurements of one
#: row (both sessions' offsets are in it, so divide by sqrt 2; the launch noise, 0.3-0.6%, is left in).
H100_SESSION_RMS = 0.017
H100_SESSION = Figure(
    H100_SESSION_RMS / math.sqrt(2),
    "13 H100 rows re-measured in a later session moved by an RMS of 1.7% (95% interval 1.2-2.8%) "
    "from their baselines, computed from docs/gpu-runs/ (issue 37); per session: 1.7%/sqrt(2); provisional",
)

PROFILES: Mapping[str, ProfileNoise] = {
    "cpu": ProfileNoise(
        "cpu",
        (),
        Figure(0.053, "median per-step CV of the 28 samples/s rows over 8 whole-suite runs, docs/lab/drift/*.json.gz"),
        Figure(
            0.027,
            "ab-rev's 10 trials at 0%: pair ratios spread 4.5% (docs/lab/drift/ab-rev-detection-2026-11-26.txt), "
            "3.2% a launch, less mixed_precision.amp's step noise (5.8%/sqrt(12))",
        ),
        Figure(
            0.068,
            "median over 28 rows of the run-to-run CV of 8 whole-suite runs in 3 sessions (docs/lab/drift/*.json.gz), "
            "less the launch and step noise",
        ),
        steps=12,  # the mixed_precision rows' cpu shape, which the committed trials ran
        baseline_launches=1,  # cpu baselines are recorded from one launch (no calibration field)
    ),
    "nvidia-h100-80gb-hbm3-x1": ProfileNoise(
        "nvidia-h100-80gb-hbm3-x1",
        ("nvidia-h100-x1",),
        Figure(0.019, "median per-step CV of the 7 samples/s rows in baselines/nvidia-h100-80gb-hbm3-x1/"),
        Figure(
            0.0045,
            "between-launch CV 0.3-0.6% (issue 37; docs/lab/gpu-results.md: copy 0.26%, BERT layer 0.24%, "
            "T5 decoder 0.21%, BERT fine-tuning AMP 0.44%)",
        ),
        H100_SESSION,
        steps=20,
        baseline_launches=3,
    ),
    "nvidia-h200-x1": ProfileNoise(
        "nvidia-h200-x1",
        ("nvidia-h200",),
        Figure(0.076, "BERT-base AMP's per-step CV; training rows 6-10% (docs/lab/gpu-results.md, profiles.py)"),
        Figure(0.003, "between-launch CV: copy 0.11%, BERT layer 0.43% (docs/lab/gpu-results.md)"),
        replace(H100_SESSION, source="the H100's figure, borrowed: no H200 row was measured in two sessions"),
        steps=20,
        baseline_launches=3,
    ),
}


def noise_of(name: str) -> ProfileNoise:
    """A profile's components by its name or an alias (``nvidia-h100-x1``)."""
    for noise in PROFILES.values():
        if name == noise.profile or name in noise.aliases:
            return noise
    known = ", ".join(n for p in PROFILES.values() for n in (p.profile, *p.aliases))
    raise ValueError(f"no measured variance components for profile {name!r}; known: {known}")


@dataclass(frozen=True)
class Row:
    """What decides one row's verdicts: its spread and the tolerance it is judged with."""

    step_cv: float
    launch_cv: float
    session_cv: float
    steps: int
    baseline_launches: int
    tolerance: float

    @property
    def launch_mean_cv(self) -> float:
        """CV of one launch's mean: the launch offset and the step noise averaged over its steps."""
        return math.hypot(self.launch_cv, self.step_cv / math.sqrt(self.steps))

    @property
    def change_cv(self) -> float:
        """Spread of an unchanged run's change against its baseline: two sessions' offsets, the run's
        launch and steps, and the baseline's launches and steps, pooled."""
        run = self.launch_mean_cv
        base = math.hypot(self.launch_cv, self.step_cv / math.sqrt(self.steps)) / math.sqrt(self.baseline_launches)
        return math.sqrt(2 * self.session_cv**2 + run**2 + base**2)

    def family_floor(self, rows: int) -> float:
        """The loss an unchanged run exceeds with probability ``FAMILY_ALPHA / rows``: Bonferroni's
        level for a run that judges ``rows`` rows' timing, so that all of them together raise a false
        alarm in at most ``FAMILY_ALPHA`` of unchanged runs (the model's normal offsets)."""
        return -statistics.NormalDist().inv_cdf(FAMILY_ALPHA / max(1, rows)) * self.change_cv

    def judged_tolerance(self, rows: int) -> float:
        """The loss this row fails beyond in a run of ``rows`` timing-judged rows: its tolerance, or the
        family's floor where that is larger (``judging.family_tolerances``; a run of one row keeps its own)."""
        return max(self.tolerance, self.family_floor(rows)) if rows > 1 else self.tolerance


def calibrated_tolerance(noise: ProfileNoise, profile: HardwareProfile, metric: str) -> float:
    """The tolerance calibration on one machine writes for a typical row (``calibration.tolerance``,
    with the profile's provisional machine spread)."""
    launch = math.hypot(noise.launch_cv.value, noise.step_cv.value / math.sqrt(noise.steps))
    return tolerance(launch, profile.machine_spread or 0.0, 1, profile.calibration_floor_of(metric))


def typical_row(noise: ProfileNoise, profile: HardwareProfile, metric: str = "samples_per_s") -> Row:
    """A typical row of the profile, with the tolerance its baselines get (calibrated on GPUs)."""
    tolerance = calibrated_tolerance(noise, profile, metric) if noise.baseline_launches > 1 else None
    return Row(
        noise.step_cv.value,
        noise.launch_cv.value,
        noise.session_cv.value,
        noise.steps,
        noise.baseline_launches,
        tolerance if tolerance is not None else profile.tolerance(metric) or 0.0,
    )


def primary_of(baseline: BaselineEntry) -> str | None:
    """The metric a row is judged by: the one stored with its spread (samples/s first)."""
    spread = [name for name, value in baseline.metrics.items() if isinstance(value, Mapping) and value.get("n")]
    if "samples_per_s" in spread:
        return "samples_per_s"
    return spread[0] if spread else None


def row_of(baseline: BaselineEntry, metric: str, profile: HardwareProfile, noise: ProfileNoise) -> Row:
    """One row's spread from its own baseline: the stored per-step spread, the calibrated launch CV
    where calibration ran (else the profile's), the profile's session offset, and the tolerance the
    gate would use (scenario-level tolerances in the test module are not seen here)."""
    stored: Mapping[str, Any] = baseline.metrics[metric]
    calibration = baseline.extra.get("calibration") or {}
    launches = int(calibration.get("repeats", 1))
    steps = max(2, int(stored["n"]) // launches)
    pooled = float(stored["std"]) / float(stored["mean"])
    measured = calibration.get(f"cv_{metric}")
    # A calibrated launch CV is of launch means, so it holds the step noise of each mean: take it out.
    launch = noise.launch_cv.value if measured is None else math.sqrt(max(0.0, measured**2 - pooled**2 / steps))
    # A baseline pooled over launches spreads by the launch offsets too: the steps alone spread less.
    step = math.sqrt(max(0.0, pooled**2 - launch**2 * (launches - 1) / launches)) if launches > 1 else pooled
    tolerances = resolve_tolerances(profile.default_tolerances([metric]), {}, baseline)
    return Row(step, launch, noise.session_cv.value, steps, launches, tolerances.get(metric, 0.0))


def min_effect_of(baseline: BaselineEntry | None, profile: HardwareProfile) -> tuple[float, str]:
    """The minimum effect a row's A/B decides against, and whose it is: the scenario's own where its
    baseline records one (at its top level or in its config), else the profile's. Baselines written
    so far do not record it (it is not part of the definition), so most rows get the profile's."""
    extra: Mapping[str, Any] = baseline.extra if baseline is not None else {}
    for where in (extra, extra.get("config"), extra.get("definition")):
        value = where.get("min_effect") if isinstance(where, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 10:
            return float(value), "the scenario's"
    return profile.min_effect, "the profile's"
