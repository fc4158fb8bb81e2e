"""Whether a measurement can be judged at all, and the tolerances its spread supports.

A throttled GPU (thermal, hardware slowdown, power brake: not the card holding
its own power cap) or a run whose fp16 loss scaling skipped most updates
measured the card or the overflow, not the stack: such a run is
``unreliable`` and never becomes a baseline. ``calibrated_tolerances`` turns
the spread between launches into tolerances. Pytest side, torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from perfsuite import metrics as registry
from perfsuite.baselines import BaselineError
from perfsuite.nvmlcodes import HARMLESS_REASONS
from perfsuite.stats import ScenarioMetrics, Summary

#: Calibrated tolerance = this many standard deviations of the difference of
#: two independent measurements (sqrt(2) x the between-launch CV), Megatron's
#: 3-sigma rule applied to "new run vs stored baseline".
CALIBRATION_SIGMAS = 3.0
TOLERANCE_CEILING = 0.9


def untrustworthy(metrics: ScenarioMetrics) -> str:
    """Why this measurement cannot be judged at all ("" if it can)."""
    return throttled(metrics) or too_many_skipped(metrics)


def throttled(metrics: ScenarioMetrics) -> str:
    """GPU clock events that slow the card (power cap, thermal, hardware
    slowdown; not sync boost) seen by NVML during the measured steps."""
    hits = [
        f"rank {h['rank']}: {', '.join(r for r in h['throttle_reasons'] if r not in HARMLESS_REASONS)}"
        for h in metrics.health
        if h.get("throttled")
    ]
    if not hits:
        return ""
    return (
        f"GPU throttled during the measured steps ({'; '.join(hits)}): the timings measure the card's "
        "clocks, not the stack; check cooling, power limits and other jobs (not recorded as a baseline)"
    )


def too_many_skipped(metrics: ScenarioMetrics) -> str:
    """Why the throughput of a run with most updates skipped cannot be judged ("" if it can)."""
    measured = len(metrics.step_times_s) + metrics.skipped_steps
    if metrics.skipped_steps * 2 <= measured:
        return ""
    return (
        f"{metrics.skipped_steps} of {measured} measured steps skipped their optimizer update on fp16 "
        "loss-scale overflow; the applied steps left are too few to judge (and such a run is not recorded)"
    )


def calibrated_tolerances(
    metrics: ScenarioMetrics, defaults: Mapping[str, float], floor: Callable[[str], float]
) -> tuple[dict[str, float], dict[str, Any]]:
    """Tolerances from the spread between launches (needs ``--perf-repeats`` >= 2).

    Noisy metrics that are gated get 3 sigma of the difference of two launches,
    clamped to [the profile's floor, 90%]; exact ones keep their default (they
    do not vary).
    """
    repeats = metrics.repeats
    if len(repeats) < 2:
        raise BaselineError("calibration needs at least 2 repeats: pass --perf-repeats N with N >= 2")
    tolerances: dict[str, float] = {}
    spread: dict[str, Any] = {"repeats": len(repeats)}
    for name, default in defaults.items():
        if not registry.get(name).noisy:
            tolerances[name] = default
            continue
        if name not in repeats[0]:
            continue  # not measured here (samples_per_ref where no reference runs)
        cv = Summary.of([r[name] for r in repeats]).cv
        spread[f"cv_{name}"] = cv
        tolerance = CALIBRATION_SIGMAS * math.sqrt(2) * cv
        spread[f"floor_{name}"] = floor(name)
        tolerances[name] = round(min(TOLERANCE_CEILING, max(floor(name), tolerance)), 3)
    return tolerances, spread
