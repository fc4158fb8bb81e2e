"""NVML's clock-event (throttle) reason bits, named once for both sides: the
ranks sample them every measured step (:mod:`perfsuite.worker.health`), the
bootstrap reads them at idle (:mod:`perfsuite.bootstrap.probe`). Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# NVML clock-event reasons that mean "slower than the card can go" (the idle
# and application-clock-setting bits are left out: they are not throttling).
THROTTLE_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal": 0x20,
        "hw_thermal": 0x40,
        "hw_power_brake": 0x80,
    }
)
#: Reasons that do not slow the card: sync boost only aligns clocks across GPUs.
HARMLESS_REASONS = frozenset({"sync_boost"})


def reasons_of(bits: int) -> list[str]:
    """Names of the throttle reasons set in ``bits``."""
    return [name for name, bit in THROTTLE_REASONS.items() if bits & bit]
