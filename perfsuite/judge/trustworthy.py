"""Whether a measurement can be judged at all.

A throttled GPU (thermal, hardware slowdown, power brake: not the card holding
its own power cap) or a run whose fp16 loss scaling skipped most updates
measured the card or the overflow, not the stack: such a run is
``unreliable`` and never becomes a baseline. The tolerances a measured spread
supports are :mod:`perfsuite.judge.calibration`'s. Pytest side, torch-free.
"""

from __future__ import annotations

from perfsuite.core.nvmlcodes import HARMLESS_REASONS
from perfsuite.judge.stats import ScenarioMetrics


def untrustworthy(metrics: ScenarioMetrics) -> str | None:
    """Why this measurement cannot be judged at all (None if it can)."""
    return throttled(metrics) or too_many_skipped(metrics)


def throttled(metrics: ScenarioMetrics) -> str | None:
    """GPU clock events that slow the card (power cap, thermal, hardware
    slowdown; not sync boost) seen by NVML during the measured steps (None: none seen)."""
    hits = [
        f"rank {h['rank']}: {', '.join(r for r in h['throttle_reasons'] if r not in HARMLESS_REASONS)}"
        for h in metrics.health
        if h.get("throttled")
    ]
    if not hits:
        return None
    return (
        f"GPU throttled during the measured steps ({'; '.join(hits)}): the timings measure the card's "
        "clocks, not the stack; check cooling, power limits and other jobs (not recorded as a baseline)"
    )


def too_many_skipped(metrics: ScenarioMetrics) -> str | None:
    """Why the throughput of a run with most updates skipped cannot be judged (None if it can)."""
    measured = len(metrics.step_times_s) + metrics.skipped_steps
    if metrics.skipped_steps * 2 <= measured:
        return None
    return (
        f"{metrics.skipped_steps} of {measured} measured steps skipped their optimizer update on fp16 "
        "loss-scale overflow; the applied steps left are too few to judge (and such a run is not recorded)"
    )
