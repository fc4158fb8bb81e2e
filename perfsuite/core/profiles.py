"""Hardware profiles: which device, backend, memory limits and default tolerances
a run uses, and under which folder of ``baselines/`` its numbers live.

The profile is picked from the machine fingerprint (``cpu`` without a GPU,
``<gpu-model>-x<count>`` with one) and can be overridden with ``--perf-profile``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, get_args

from perfsuite.core.metrics import METRICS, MetricError
from perfsuite.core.protocol import RankStart

#: sigma_machine measured across three H100 sessions: provisional until the card-to-card panel
#: has cross-card pairs. See ``HardwareProfile.machine_spread``.
PROVISIONAL_GPU_MACHINE_SPREAD = round(0.017 / math.sqrt(2), 4)


class ProfileError(ValueError):
    """An unknown or invalid profile was asked for."""


#: ``HardwareProfile.min_effect`` of the GPU profiles.
GPU_MIN_EFFECT = 0.02


@dataclass(frozen=True)
class HardwareProfile:
    """Settings shared by every scenario run on one kind of hardware."""

    name: str
    device: Literal["cpu", "cuda"]
    #: Relative tolerance per metric when neither baseline nor scenario sets
    #: one, over the metric's registry default for this device kind.
    tolerances: Mapping[str, float] = field(default_factory=dict)
    #: Default per-scenario wall-clock limit (``--perf-timeout`` overrides).
    timeout_s: float = 900.0
    #: cpu: per-rank memory budget (MiB above the rank's footprint after imports),
    #: enforced with RLIMIT_DATA so an oversize scenario fails with a real
    #: allocation error.
    rank_memory_budget_mib: int | None = None
    #: cuda: usable device memory per rank, to emulate a smaller card.
    device_memory_cap_mib: int | None = None
    #: Most ranks a scenario may use here (None: bounded by GPUs instead).
    max_world_size: int | None = None
    #: Lowest tolerance calibration (``--perf-calibrate``, ``bootstrap``) may
    #: write for a noisy metric. None: that metric's default tolerance here,
    #: for machines whose drift between sessions dwarfs the spread of
    #: back-to-back launches (the cpu VM: 15% between quiet runs, 20-47% when
    #: busy, while three launches in a row spread by a few percent).
    calibration_floor: float | None = 0.03
    #: Max coefficient of variation of the primary metric's per-step samples
    #: before a run is judged ``unreliable`` rather than pass or regression.
    #: GPU training rows spread 6-10% step to step from host-side jitter, yet the
    #: mean of 20 steps is known to ~2% and the Welch test uses that spread
    #: (docs/lab/profile-defaults.md).
    max_cv: float = 0.15
    #: A regression whose primary metric spreads step to step more than this many
    #: times as much as when its baseline was recorded (and by over 2%) is
    #: ``unreliable``: the machine is not in the state the baseline and its
    #: tolerance describe (an H100 row recorded at 0.8% CV fell 8-14% with nothing
    #: planted: docs/lab/profile-defaults.md). None: off (cpu, where the contention
    #: probe and wide tolerances cover a busy host).
    max_spread_growth: float | None = 3.0
    #: Whether a timed metric (``Metric.timed``: samples/s, TFLOP/s, ...) is judged against a
    #: baseline recorded on another processor (``perfsuite.launch.identity``). False on cpu: the
    #: VM's processor changes between sessions, and the same code measured 0.33 against
    #: 0.65 TFLOP/s of bf16 matmuls on two of them, so such a row's
    #: timing is reported as ``other_machine``, its memory still judged. GPU profiles time
    #: the card, and judge a baseline from another card of the same SKU, naming both.
    timed_on_other_processor: bool = True
    #: sigma_machine of the tolerance model (``perfsuite.judge.calibration``): the spread of one machine's
    #: offset (card, host, session) across the machines of this profile, used where a calibration
    #: pool has too few machines to measure it. The GPU figure is provisional: rows measured again
    #: in a later session moved by an RMS of 1.7%, the difference of two sessions' offsets, so one
    #: offset spreads by 1.7% / sqrt(2) = 1.2% (docs/lab/profile-defaults.md). None: no figure
    #: (cpu, whose timing is judged on the recording processor only; several hosts of that
    #: processor still measure their spread).
    machine_spread: float | None = PROVISIONAL_GPU_MACHINE_SPREAD
    #: The smallest slowdown that matters here (0.02: steps 2% slower): what the sequential A/B
    #: (``--perf-ab``, ``ab-rev``, ``bisect``) decides regression or pass against. A scenario's
    #: ``min_effect`` and ``--perf-min-effect`` override it. GPUs: an interleaved pair on one card
    #: spreads 0.3-0.6% launch to launch, so 2% is about 3 sigma of one pair (docs/trust.md).
    min_effect: float = GPU_MIN_EFFECT
    #: Warmup ends once the last 3 step times spread less than this (relative).
    steady_threshold: float = 0.05
    #: MiB of the reference workload each rank times after every measured step
    #: (``samples_per_ref``); 0: none. Off in the built-in profiles: on the cpu
    #: VM it did not track the drift and slowed a matmul microbenchmark by ~10%
    #: (docs/lab/reference-workload.md).
    reference_mib: int = 0
    #: A regression measured while other processes kept more CPU cores than
    #: this busy (on average, on the busiest host) is ``unreliable``.
    max_foreign_cores: float = 0.25
    #: Likewise for CPU time the hypervisor stole.
    max_steal_cores: float = 0.1
    #: Dense peak TFLOP/s per GPU by precision, for MFU where perfsuite.judge.flops
    #: does not know this GPU (or to override its datasheet figure).
    peak_tflops: Mapping[str, float] = field(default_factory=dict)
    #: Price of one GPU (on cpu: one rank) for one hour, for cost per sample
    #: (perfsuite.reports.cost); the ``perf_gpu_hour_price`` ini option overrides it.
    gpu_hour_price: float | None = None
    #: Currency of ``gpu_hour_price``.
    currency: str = "USD"
    #: How a launch's processes start (:data:`~perfsuite.core.protocol.RankStart`). ``warm``: the
    #: torchrun agent is forked from a warm parent that imported torch and the scenario's
    #: libraries once for the whole run (:mod:`perfsuite.launch.warm`), and the ranks from the
    #: agent. ``fork``: the agent is a fresh interpreter and the ranks its forks (torchrun
    #: ``--run-path --start-method fork``). ``exec``: torchrun's default, a fresh interpreter per
    #: process. None: ``warm`` on cpu; ``exec`` on cuda until a GPU has shown that forked ranks
    #: train and measure there as exec'd ones do.
    rank_start: RankStart | None = None
    #: Extra keys (besides name and device) looked up in Scenario.variants/expect.
    aliases: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerances", MappingProxyType(dict(self.tolerances)))
        if self.rank_start is None:
            object.__setattr__(self, "rank_start", "warm" if self.device == "cpu" else "exec")
        elif self.rank_start not in get_args(RankStart):
            raise ProfileError(
                f"profile {self.name!r}: rank_start must be one of {', '.join(get_args(RankStart))}, "
                f"not {self.rank_start!r}"
            )
        if not 0 < self.min_effect < 10:
            raise ProfileError(
                f"profile {self.name!r}: min_effect must be a slowdown fraction above 0 (0.02 = 2%), "
                f"got {self.min_effect!r}"
            )
        unknown = sorted(set(self.tolerances) - {m.name for m in METRICS})
        if unknown:
            raise ProfileError(f"profile {self.name!r}: unknown tolerance metrics {unknown}")

    def contention_limits(self) -> dict[str, float]:
        """The contention limits, as a results file carries them for an A/B that reads it."""
        return {"max_foreign_cores": self.max_foreign_cores, "max_steal_cores": self.max_steal_cores}

    def tolerance(self, metric: str) -> float | None:
        """Default tolerance of ``metric`` here: the profile's own, else the
        registry entry's for this device kind; None means not gated by default."""
        if metric in self.tolerances:
            return self.tolerances[metric]
        try:
            return METRICS.get(metric).tolerances.get(self.device)
        except MetricError:
            return None

    def calibration_floor_of(self, metric: str) -> float:
        """The lowest tolerance calibration may give ``metric`` on this profile."""
        if self.calibration_floor is not None:
            return self.calibration_floor
        return self.tolerance(metric) or 0.0

    def memory_limit(self) -> str:
        """The memory limit an out-of-memory ran into, in words ("" where the profile sets none)."""
        if self.device == "cpu" and self.rank_memory_budget_mib:
            return f"{self.rank_memory_budget_mib} MiB per rank above its footprint (RLIMIT_DATA, profile {self.name})"
        if self.device == "cuda" and self.device_memory_cap_mib:
            return f"{self.device_memory_cap_mib} MiB of device memory per rank (profile {self.name}'s cap)"
        return ""

    def default_tolerances(self, metrics: Iterable[str]) -> dict[str, float]:
        found = {name: self.tolerance(name) for name in metrics}
        return {name: tol for name, tol in found.items() if tol is not None}

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def entry_processor(self, fingerprint: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The processor whose baseline entry a run on ``fingerprint`` reads and records
        (:class:`perfsuite.store.baselines.BaselineStore`): its own, where this profile judges timing
        on the recording processor only (cpu), so that several processors keep their entries side by
        side; None where it judges timing across processors (GPU profiles: one entry per scenario,
        the card is what is timed)."""
        proc = fingerprint.get("processor")
        return None if self.timed_on_other_processor or not isinstance(proc, Mapping) else proc

    @property
    def variant_keys(self) -> tuple[str, ...]:
        """Most specific first: the profile itself, its aliases, then the device kind."""
        return (self.name, *self.aliases, self.device)


# Default tolerances come from each metric's registry entry (perfsuite.core.metrics):
# on cpu 40% for throughput (a shared 2-core machine swings by tens of percent
# between runs), 15% for peak memory, 1% for exact model-state bytes.
CPU = HardwareProfile(
    name="cpu",
    device="cpu",
    timeout_s=600.0,
    steady_threshold=0.25,
    max_world_size=4,  # ranks share 2 cores: more would measure the scheduler
    # Tiny CPU steps take milliseconds to a second; a CV of 15-40% is normal
    # on a shared 2-core machine, so only chaos is called unreliable.
    max_cv=0.5,
    max_spread_growth=None,
    timed_on_other_processor=False,
    machine_spread=None,
    # Above the footprint after the row's libraries are imported (RankJob.imports):
    # between what bf16 ZeRO-3 needs (550-600 MiB, must fit) and fp32 DDP (750-800,
    # must not) on model_state_sharding's cpu shape (docs/lab/profile-defaults.md).
    rank_memory_budget_mib=675,
    calibration_floor=None,
    # A 2-core VM's launches spread 3% (the ab-rev trials' pairs): 10% is about 2 sigma of a pair.
    min_effect=0.10,
    description="any machine without a GPU: gloo, tiny shapes, 2 ranks, 675 MiB per rank",
)
CUDA_32GB = HardwareProfile(
    name="cuda-32gb",
    device="cuda",
    device_memory_cap_mib=32 * 1024,
    description="any larger NVIDIA GPU capped to 32 GiB per rank, emulating the seed's V100-32GB",
)

BUILTIN_PROFILES: Mapping[str, HardwareProfile] = MappingProxyType({p.name: p for p in (CPU, CUDA_32GB)})


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def gpu_profile_name(gpu_name: str, count: int) -> str:
    """``NVIDIA H100 80GB HBM3`` x1 -> ``nvidia-h100-80gb-hbm3-x1``."""
    return f"{slug(gpu_name)}-x{count}"


def gpu_profile(name: str) -> HardwareProfile:
    """A profile for a GPU model seen in the fingerprint (no built-in entry needed)."""
    return HardwareProfile(name=name, device="cuda")


def profile_for(fingerprint: Mapping[str, Any]) -> str:
    """Default profile name for a machine fingerprint."""
    gpus = fingerprint.get("gpus") or []
    if not gpus:
        return CPU.name
    return gpu_profile_name(gpus[0]["name"], len(gpus))


@dataclass(frozen=True)
class ProfileRegistry:
    """Built-in profiles plus those plugins contribute via ``pytest_perfsuite_profiles``."""

    profiles: Mapping[str, HardwareProfile] = field(default_factory=lambda: dict(BUILTIN_PROFILES))

    def with_extra(self, extra: Iterable[HardwareProfile]) -> ProfileRegistry:
        merged = dict(self.profiles)
        for profile in extra:
            merged[profile.name] = profile
        return replace(self, profiles=merged)

    def get(self, name: str, fingerprint: Mapping[str, Any]) -> HardwareProfile:
        if name in self.profiles:
            return self.profiles[name]
        if name == profile_for(fingerprint) or (fingerprint.get("gpus") and name.startswith("nvidia-")):
            return gpu_profile(name)
        raise ProfileError(
            f"unknown profile {name!r} for --perf-profile; known: "
            f"{', '.join(sorted(self.profiles))} or a GPU profile like "
            f"'{profile_for({'gpus': [{'name': 'NVIDIA H100 80GB HBM3'}]})}'"
        )
