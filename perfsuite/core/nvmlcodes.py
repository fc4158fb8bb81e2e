"""NVML's clock-event (throttle) reason bits, named once for both sides: the
ranks sample them every measured step (:mod:`perfsuite.rank.worker.health`), the
bootstrap reads them at idle (:mod:`perfsuite.commands.bootstrap.probe`). Torch-free."""

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
#: Reasons that do not make a measurement untrustworthy. They stay in the
#: health record; only the others make a run ``unreliable``.
#: - ``sync_boost`` only aligns clocks across the GPUs of one group.
#: - ``sw_power_cap`` is the card holding its own power limit under a sustained
#:   dense load: the workload's steady state, the same launch after launch, so
#:   it is the ceiling, not noise. Measured on an H200 (2026-11-26,
#:   docs/gpu-runs/): every best-shape matmul (tf32, fp16, bf16, fp8) drew
#:   684-694 W of its 700 W with NVML reporting the cap on every measured step,
#:   at 1500-1710 MHz against 1980; judged as throttling, no matmul ceiling of
#:   that card could ever be recorded. The limit itself is recorded
#:   (``power_limit_w``), so a lowered one is visible beside the verdict.
#: Thermal and hardware slowdowns and the power brake are the machine's
#: condition, not the workload's: those make a run unreliable.
HARMLESS_REASONS = frozenset({"sync_boost", "sw_power_cap"})


def reasons_of(bits: int) -> list[str]:
    """Names of the throttle reasons set in ``bits``."""
    return [name for name, bit in THROTTLE_REASONS.items() if bits & bit]
