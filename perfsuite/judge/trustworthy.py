"""Whether a measurement can be judged at all, and the tolerances its spread supports.

A throttled GPU (thermal, hardware slowdown, power brake: not the card holding
its own power cap) or a run whose fp16 loss scaling skipped most updates
measured the card or the overflow, not the stack: such a run is
``unreliable`` and never becomes a baseline. ``tolerance`` is the calibrated
tolerance model; the rest of the module estimates its inputs from the launches
of one or several machines. Pytest side, torch-free.

The tolerance model. A launch on machine m measures ``mu * (1 + b_m + e)``:
``b_m`` is that machine's offset (card, host, session), spread ``sigma_machine``
across the machines of a profile; ``e`` is launch-to-launch noise, spread
``cv_launch``. The baseline is the mean over M machines' means, and the gate
compares one new measurement with it, maybe on a machine not in the pool. The
relative difference then has variance::

    cv_launch**2 * (1 + 1/n)  +  sigma_machine**2 * (1 + 1/M)

(the new machine's own offset, plus the error of the pooled mean of M offsets).
The launch term is taken as ``2 * cv_launch**2`` (n = 1) as before pooling:
the n launches of a calibration run back to back and see less than a later
session does, so the baseline is not credited with their average. Hence::

    tolerance = clamp(k * sqrt(2 * cv_launch**2 + (1 + 1/M) * sigma_machine**2),
                      floor, 0.9)

with k = 3 (``CALIBRATION_SIGMAS``). A machine offset does not go away on the
confirmation relaunch, which runs on the same card: a card beyond the tolerance
fails every run, so the margin is sized for a persistent offset, one card in
~700 (one-sided normal tail at 3 sigma) per row. With one machine and no
spread this is the earlier 3 x sqrt(2) x CV; with one machine and the profile's
provisional ``sigma_machine`` it is 3 x sqrt(2 cv**2 + 2 sigma**2), the
difference of two machines' draws.

With one machine, ``sigma_machine`` is the profile's provisional figure
(``HardwareProfile.machine_spread``; none on cpu). Measured across two machines
it rests on one degree of freedom (two cards may agree by chance), so below
``MIN_MACHINES`` machines it is never taken below the provisional figure.

Calibration pooled across the machines of one profile. Each calibration
keeps, in its baseline entry's ``calibration``, a *source*: the per-launch
values of every calibrated metric and the machine that measured them (its cards by UUID, else its host and processor). A later calibration on
another machine, or ``python -m perfsuite calibrate --pool`` over baselines
brought from several runners, adds its source to the ones the entry holds
instead of replacing them; a machine's newer source replaces its older one.
From the sources, a one-way random-effects (ANOVA) estimate gives the launch
CV within machines and the spread between them; the baseline's mean becomes the
mean of the machines' means, and the tolerance covers both spreads
(the model above).

Sources from before a change of the scenario's definition are not pooled, nor,
on a profile that judges timing on the recording processor only, those of
another processor; a plain ``--perf-update-baselines`` ends the pool, since its
sources measured the baseline it replaces.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core.nvmlcodes import HARMLESS_REASONS
from perfsuite.core.profiles import HardwareProfile
from perfsuite.judge import definition
from perfsuite.judge.stats import ScenarioMetrics, Summary
from perfsuite.launch import identity
from perfsuite.store.baselines import BaselineEntry, BaselineError

#: k of the tolerance model: standard deviations of the difference between a new
#: measurement and the baseline (Megatron's 3-sigma rule).
CALIBRATION_SIGMAS = 3.0
TOLERANCE_CEILING = 0.9
#: Machines whose measured spread is used even below the profile's provisional figure.
MIN_MACHINES = 3


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


def tolerance(cv_launch: float, sigma_machine: float, machines: int, floor: float) -> float:
    """The calibrated tolerance (the module's model), clamped to [``floor``, 90%]."""
    spread = math.sqrt(2 * cv_launch**2 + (1 + 1 / machines) * sigma_machine**2)
    return round(min(TOLERANCE_CEILING, max(floor, CALIBRATION_SIGMAS * spread)), 3)


def machine_spread(measured: float | None, machines: int, provisional: float | None) -> tuple[float, str]:
    """The ``sigma_machine`` a tolerance uses, and its basis: ``measured`` across the pool's
    machines, the profile's ``provisional`` figure, or ``none`` (one machine, no figure)."""
    if measured is None or machines < 2:
        return (provisional, "provisional") if provisional is not None else (0.0, "none")
    if machines < MIN_MACHINES and provisional is not None and provisional > measured:
        return provisional, "provisional"  # too few machines to trust a spread below it
    return measured, "measured"


#: The baseline entry's key for the calibration data.
CALIBRATION = "calibration"
#: What :meth:`perfsuite.store.baselines.BaselineStore.record` calls, under the file's lock, with the
#: stored entry and the new one, to get the entry it writes.
Merge = Callable[[BaselineEntry | None, BaselineEntry], BaselineEntry]


@dataclass(frozen=True)
class Facts:
    """What the profile says about calibrating: kept in the calibration data, so that pooling
    baselines brought from other runners needs no profile of its own."""

    floors: Mapping[str, float]
    provisional: float | None
    across_processors: bool
    primary: str = ""  # the scenario's primary metric, which messages describe

    @classmethod
    def of(cls, calibration: Mapping[str, Any]) -> Facts:
        floors = {k.removeprefix("floor_"): float(v) for k, v in calibration.items() if k.startswith("floor_")}
        provisional, across = calibration.get("profile_machine_spread"), calibration.get("across_processors", True)
        return cls(floors, provisional, bool(across), str(calibration.get("primary", "")))

    def to_json(self) -> dict[str, Any]:
        floors = {f"floor_{name}": floor for name, floor in self.floors.items()}
        return {**floors, "profile_machine_spread": self.provisional, "across_processors": self.across_processors,
                "primary": self.primary}  # fmt: skip


@dataclass(frozen=True)
class Spread:
    """One metric's launches of several machines, relative to their mean."""

    mean: float  # of the machines' means, each machine weighing the same
    cv_launch: float  # within machines, pooled
    machine: float | None  # between machines (None: one machine)
    machines: int
    launches: int


def components(groups: Sequence[Sequence[float]]) -> Spread:
    """One-way random-effects estimate (ANOVA, unbalanced): the between-machine variance is
    (MS_between - MS_within) / n0, floored at 0 (launch noise alone can spread the means)."""
    means = [statistics.fmean(g) for g in groups]
    total, machines = sum(len(g) for g in groups), len(groups)
    if total <= machines:
        raise BaselineError("a calibration source needs at least 2 launches of one machine to see the launch spread")
    grand = statistics.fmean(means)
    ms_within = sum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g) / (total - machines)
    cv = math.sqrt(ms_within) / grand
    if machines < 2:
        return Spread(grand, cv, None, machines, total)
    weighted = sum(len(g) * m for g, m in zip(groups, means, strict=True)) / total
    ms_between = sum(len(g) * (m - weighted) ** 2 for g, m in zip(groups, means, strict=True)) / (machines - 1)
    n0 = (total - sum(len(g) ** 2 for g in groups) / total) / (machines - 1)
    between = max(0.0, (ms_between - ms_within) / n0)
    return Spread(grand, cv, math.sqrt(between) / grand, machines, total)


def source(
    metrics: ScenarioMetrics, names: Iterable[str], fingerprint: Mapping[str, Any], commit: str | None, at: str
) -> dict[str, Any]:
    """This calibration's launches of ``names``, as the pool keeps them."""
    key, words = identity.machine(fingerprint)
    steps = {name: asdict(s) for name in names if (s := metrics.summary(name)) is not None}
    return {
        "machine": key,
        "label": words,
        "processor": identity.processor_text(fingerprint),
        "recorded_at": at,
        "commit": commit,
        "launches": {name: [float(r[name]) for r in metrics.repeats] for name in names},
        "steps": steps,
    }


def calibrated_names(metrics: ScenarioMetrics, defaults: Mapping[str, float]) -> list[str]:
    """The gated metrics calibration measures the spread of: noisy ones this run measured."""
    return [n for n in defaults if registry.get(n).noisy and metrics.repeats and n in metrics.repeats[0]]


def calibrate(
    metrics: ScenarioMetrics,
    defaults: Mapping[str, float],
    profile: HardwareProfile,
    new_source: dict[str, Any],
    primary: str,
) -> tuple[dict[str, float], dict[str, Any]]:
    """Tolerances and calibration data of this machine's launches alone (``--perf-repeats`` >= 2);
    exact metrics keep their default (they do not vary)."""
    if len(metrics.repeats) < 2:
        raise BaselineError("calibration needs at least 2 repeats: pass --perf-repeats N with N >= 2")
    names = calibrated_names(metrics, defaults)
    facts = Facts({n: profile.calibration_floor_of(n) for n in names}, profile.machine_spread,
                  profile.timed_on_other_processor, primary)  # fmt: skip
    _, tolerances, calibration = pooled([new_source], facts)
    exact = {n: tol for n, tol in defaults.items() if not registry.get(n).noisy}
    return {**exact, **tolerances}, calibration


def pooled(
    sources: Sequence[Mapping[str, Any]], facts: Facts
) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """From the sources of one entry: the pooled metric values, the tolerances, the calibration data."""
    names = [n for n in facts.floors if all(n in s["launches"] for s in sources)]
    values: dict[str, Any] = {}
    tolerances: dict[str, float] = {}
    data: dict[str, Any] = {**facts.to_json(), "machines": len(sources), "sources": list(sources)}
    data["repeats"] = sum(len(next(iter(s["launches"].values()), [])) for s in sources)
    for name in names:
        spread = components([s["launches"][name] for s in sources])
        sigma, basis = machine_spread(spread.machine, spread.machines, facts.provisional)
        tolerances[name] = tolerance(spread.cv_launch, sigma, spread.machines, facts.floors[name])
        values[name] = _value(spread, [s.get("steps", {}).get(name) for s in sources])
        data.update({f"cv_{name}": spread.cv_launch, f"machine_spread_{name}": sigma,
                     f"machine_spread_basis_{name}": basis})  # fmt: skip
        if spread.machine is not None:
            data[f"machine_spread_measured_{name}"] = spread.machine
    return values, tolerances, data


def _value(spread: Spread, steps: Sequence[Mapping[str, Any] | None]) -> Any:
    """The pooled baseline value: the machines' mean, with the step samples' spread over all
    machines where each kept one (the Welch test reads it)."""
    if any(s is None for s in steps):
        return float(f"{spread.mean:.6g}")
    parts = [Summary(float(s["mean"]), float(s["std"]), int(s["n"])) for s in steps if s is not None]
    n = sum(p.n for p in parts)
    centre = sum(p.mean * p.n for p in parts) / n
    squares = sum((p.n - 1) * p.std**2 + p.n * (p.mean - centre) ** 2 for p in parts)
    return asdict(Summary(spread.mean, math.sqrt(squares / max(1, n - 1)), n))


def sources_of(entry: BaselineEntry | None) -> list[Mapping[str, Any]]:
    """The sources a stored entry holds (none before pooling was kept, or after a plain update)."""
    if entry is None:
        return []
    found = (entry.extra.get(CALIBRATION) or {}).get("sources")
    return [s for s in found if _well_formed(s)] if isinstance(found, list) else []


def _well_formed(found: Any) -> bool:
    if not isinstance(found, Mapping) or not isinstance(found.get("machine"), str):
        return False
    launches = found.get("launches")
    return isinstance(launches, Mapping) and all(
        isinstance(v, list) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
        for v in launches.values()
    )


def merge(*groups: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One source per machine: a machine's newest calibration replaces its older ones."""
    newest: dict[str, Mapping[str, Any]] = {}
    for found in sorted((s for g in groups for s in g), key=lambda s: str(s.get("recorded_at", ""))):
        newest[found["machine"]] = found
    return list(newest.values())


def not_poolable(old: BaselineEntry, new: BaselineEntry, theirs: Mapping[str, Any], facts: Facts, ours: str) -> str:
    """Why source ``theirs`` of ``old`` cannot be pooled with ``new`` ("" when it can)."""
    changed = definition.changes(old.extra.get("definition") or {}, new.extra.get("definition") or {})
    if changed:
        return f"the scenario's definition changed since ({'; '.join(changed)})"
    if not facts.across_processors and theirs.get("processor") != ours:
        return f"measured on another processor ({theirs.get('processor')}), whose timing this profile does not compare"
    return ""


def rejoin(facts: Facts, ours: Mapping[str, Any]) -> Merge:
    """The merge for :meth:`BaselineStore.record`: this machine's calibration (``ours``, in the new
    entry) pooled with the other machines' sources the stored entry holds, under the file's lock."""

    def pool(old: BaselineEntry | None, new: BaselineEntry) -> BaselineEntry:
        if old is None:
            return new
        kept, dropped = [], []
        for theirs in sources_of(old):
            why = not_poolable(old, new, theirs, facts, str(ours["processor"]))
            if why:
                dropped.append(f"{theirs.get('label')}: {why}")
            elif theirs["machine"] != ours["machine"]:
                kept.append(theirs)
        if not kept:
            return with_dropped(new, dropped)
        return with_dropped(pooled_entry(new, merge(kept, [ours]), facts), dropped)

    return pool


def pooled_entry(base: BaselineEntry, sources: Sequence[Mapping[str, Any]], facts: Facts) -> BaselineEntry:
    """``base`` with its calibrated metrics, tolerances and calibration data pooled over ``sources``."""
    values, tolerances, data = pooled(sources, facts)
    return replace(
        base,
        metrics={**base.metrics, **values},
        tolerances={**base.tolerances, **tolerances},
        extra={**base.extra, CALIBRATION: data},
    )


def with_dropped(entry: BaselineEntry, dropped: Sequence[str]) -> BaselineEntry:
    """Say in the calibration data which earlier machines were left out, and why."""
    if not dropped:
        return entry
    data = {**(entry.extra.get(CALIBRATION) or {}), "not_pooled": list(dropped)}
    return replace(entry, extra={**entry.extra, CALIBRATION: data})


def end_pool(at: str) -> Merge:
    """The merge of a plain ``--perf-update-baselines``: the stored calibration keeps its figures
    (its tolerances stay in force) but no longer its sources, which measured the replaced baseline."""

    def end(old: BaselineEntry | None, new: BaselineEntry) -> BaselineEntry:
        data = new.extra.get(CALIBRATION)
        if not isinstance(data, Mapping) or "sources" not in data:
            return new
        ended = {k: v for k, v in data.items() if k != "sources"}
        ended["pool_ended"] = f"{at}: re-recorded by --perf-update-baselines; the next calibration starts a pool"
        return replace(new, extra={**new.extra, CALIBRATION: ended})

    return end


def describe(data: Mapping[str, Any], metric: str, tolerance_now: float | None) -> str:
    """One metric's calibration in words, for the recording message and the pool command."""
    if f"cv_{metric}" not in data:
        return ""
    basis = data.get(f"machine_spread_basis_{metric}")
    sigma = float(data.get(f"machine_spread_{metric}") or 0.0)
    measured = data.get(f"machine_spread_measured_{metric}")
    spread = {
        "measured": f"machine spread {sigma:.2%} measured",
        "provisional": f"machine spread {sigma:.2%} PROVISIONAL (the profile's figure"
        + (f"; {data['machines']} machines measured {measured:.2%}" if measured is not None else "; one machine")
        + ")",
        "none": "no machine spread (one machine, and the profile has no figure)",
    }.get(str(basis), "")
    tol = f"tolerance {tolerance_now:.1%}, " if tolerance_now is not None else ""
    return (
        f"{metric} {tol}launch CV {float(data[f'cv_{metric}']):.2%}, {spread}; "
        f"{data.get('machines', 1)} machine(s), {data.get('repeats')} launches"
    )
