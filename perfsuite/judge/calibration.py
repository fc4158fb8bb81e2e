"""Calibrated tolerances: the tolerances a measured spread supports, pooled across machines.

``tolerance`` is the calibrated tolerance model; the rest of the module estimates
its inputs from the launches of one or several machines and keeps them, as a
:class:`Calibration` record, in the baseline entry (``calibration``, the same
JSON as ever: :meth:`Calibration.to_json` and :meth:`Calibration.from_json` are the
store's boundary). Pytest side, torch-free.

The tolerance model. A launch on machine m measures ``mu * (1 + b_m + e)``:
``b_m`` is that machine's offset (card, host, session), spread ``sigma_machine``
across the machines of a profile; ``e`` is launch-to-launch noise, spread
``cv_launch``. The baseline is the mean over M machines' means, and the gate
compares one new measurement with it, maybe on a machine not in the pool. The
relative difference then has variance::

    cv_launch**2 * (1 + 1/n)  +  sigma_machine**2 * (1 + 1/M)

(the new machine's own offset, plus the error of the pooled mean of M offsets).
The launch term is taken as ``2 * cv_launch**2`` (n = 1): the n launches of a
calibration run back to back and see less than a later session does, so the
baseline is not credited with their average. Hence::

    tolerance = clamp(k * sqrt(2 * cv_launch**2 + (1 + 1/M) * sigma_machine**2),
                      floor, 0.9)

with k = 3 (``CALIBRATION_SIGMAS``). A machine offset does not go away on the
confirmation relaunch, which runs on the same card: a card beyond the tolerance
fails every run, so the margin is sized for a persistent offset, one card in
~700 (one-sided normal tail at 3 sigma) per row. With one machine and no
spread this is 3 x sqrt(2) x CV; with one machine and the profile's
provisional ``sigma_machine`` it is 3 x sqrt(2 cv**2 + 2 sigma**2), the
difference of two machines' draws.

With one machine, ``sigma_machine`` is the profile's provisional figure
(``HardwareProfile.machine_spread``; none on cpu). Measured across two machines
it rests on one degree of freedom (two cards may agree by chance), so below
``MIN_MACHINES`` machines it is never taken below the provisional figure.

Calibration pooled across the machines of one profile. Each calibration
keeps, in its baseline entry's ``calibration``, a *source*: the per-launch
values of every calibrated metric and the machine that measured them (its cards by UUID, else its host and
processor). A later calibration on
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

#: The baseline entry's key for the calibration record.
CALIBRATION = "calibration"
#: One machine's calibration launches as an entry keeps them (:func:`source_of`): its ``machine`` key,
#: ``label``, ``processor``, ``recorded_at``, ``commit``, ``launches`` (per-launch values by metric) and
#: ``steps`` (each metric's step samples as {mean, std, n}).
Source = Mapping[str, Any]
#: What :meth:`perfsuite.store.baselines.BaselineStore.record` calls, under the file's lock, with the
#: stored entry and the new one, to get the entry it writes.
Merge = Callable[[BaselineEntry | None, BaselineEntry], BaselineEntry]


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


@dataclass(frozen=True)
class Facts:
    """What the profile says about calibrating: kept in the calibration record, so that pooling
    baselines brought from other runners needs no profile of its own."""

    floors: Mapping[str, float]
    provisional: float | None
    across_processors: bool
    primary: str = ""  # the scenario's primary metric, which messages describe

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> Facts:
        """The facts of a stored calibration record (its JSON)."""
        floors = {k.removeprefix("floor_"): float(v) for k, v in stored.items() if k.startswith("floor_")}
        provisional, across = stored.get("profile_machine_spread"), stored.get("across_processors", True)
        return cls(floors, provisional, bool(across), str(stored.get("primary", "")))

    def to_json(self) -> dict[str, Any]:
        floors = {f"floor_{name}": floor for name, floor in self.floors.items()}
        return {
            **floors,
            "profile_machine_spread": self.provisional,
            "across_processors": self.across_processors,
            "primary": self.primary,
        }


@dataclass(frozen=True)
class MetricCalibration:
    """One metric's calibration: its launch CV, the machine spread its tolerance used, and that spread's
    basis (:func:`machine_spread`). None: absent from the stored record."""

    cv_launch: float
    machine_spread: float | None = None
    basis: str | None = None
    #: The spread measured between the pool's machines (None: one machine).
    measured: float | None = None

    def to_json(self, metric: str) -> dict[str, Any]:
        stored: dict[str, Any] = {f"cv_{metric}": self.cv_launch}
        if self.machine_spread is not None:
            stored[f"machine_spread_{metric}"] = self.machine_spread
        if self.basis is not None:
            stored[f"machine_spread_basis_{metric}"] = self.basis
        if self.measured is not None:
            stored[f"machine_spread_measured_{metric}"] = self.measured
        return stored

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], metric: str) -> MetricCalibration:
        basis = stored.get(f"machine_spread_basis_{metric}")
        return cls(
            float(stored[f"cv_{metric}"]),
            stored.get(f"machine_spread_{metric}"),
            None if basis is None else str(basis),
            stored.get(f"machine_spread_measured_{metric}"),
        )

    def describe_spread(self, machines: int | None) -> str:
        """The machine spread in words ("" for a basis this version does not know)."""
        sigma = float(self.machine_spread or 0.0)
        if self.basis == "measured":
            return f"machine spread {sigma:.2%} measured"
        if self.basis == "provisional":
            seen = (
                f"; {machines} machines measured {self.measured:.2%}" if self.measured is not None else "; one machine"
            )
            return f"machine spread {sigma:.2%} PROVISIONAL (the profile's figure{seen})"
        if self.basis == "none":
            return "no machine spread (one machine, and the profile has no figure)"
        return ""


@dataclass(frozen=True)
class Calibration:
    """What a calibration keeps in its baseline entry: the profile's facts, each calibrated metric's
    spread, and the sources they were pooled from."""

    facts: Facts
    metrics: Mapping[str, MetricCalibration]
    machines: int | None = None
    repeats: int | None = None
    #: The machines' launches (None once a plain re-recording ended the pool, or never kept).
    sources: tuple[Source, ...] | None = None
    #: Earlier machines left out of the pool, each with why.
    not_pooled: tuple[str, ...] | None = None
    #: When and why the pool ended (None while it goes on).
    pool_ended: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as the baseline entry stores it."""
        stored: dict[str, Any] = self.facts.to_json()
        optional = {"machines": self.machines, "repeats": self.repeats, "pool_ended": self.pool_ended}
        stored.update({key: value for key, value in optional.items() if value is not None})
        if self.sources is not None:
            stored["sources"] = list(self.sources)
        if self.not_pooled is not None:
            stored["not_pooled"] = list(self.not_pooled)
        for name, metric in self.metrics.items():
            stored.update(metric.to_json(name))
        return stored

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Calibration:
        """The record a baseline entry stores (older entries lack the machines, sources and spreads)."""
        names = [key.removeprefix("cv_") for key in stored if key.startswith("cv_")]
        sources, not_pooled = stored.get("sources"), stored.get("not_pooled")
        return cls(
            Facts.of(stored),
            {name: MetricCalibration.from_json(stored, name) for name in names},
            stored.get("machines"),
            stored.get("repeats"),
            tuple(sources) if isinstance(sources, list) else None,
            tuple(not_pooled) if isinstance(not_pooled, list) else None,
            stored.get("pool_ended"),
        )

    def describe(self, metric: str, tolerance_now: float | None) -> str:
        """One metric's calibration in words, for the recording message and the pool command
        ("" when the metric was not calibrated)."""
        found = self.metrics.get(metric)
        if found is None:
            return ""
        tol = f"tolerance {tolerance_now:.1%}, " if tolerance_now is not None else ""
        machines = 1 if self.machines is None else self.machines
        return (
            f"{metric} {tol}launch CV {found.cv_launch:.2%}, {found.describe_spread(self.machines)}; "
            f"{machines} machine(s), {self.repeats} launches"
        )


def describe(stored: Mapping[str, Any], metric: str, tolerance_now: float | None) -> str:
    """One metric's calibration in words, read from the record a baseline entry stores."""
    return Calibration.from_json(stored).describe(metric, tolerance_now)


@dataclass(frozen=True)
class Spread:
    """One metric's launches of several machines, relative to their mean."""

    mean: float  # of the machines' means, each machine weighing the same
    cv_launch: float  # within machines, pooled
    machine: float | None  # between machines (None: one machine)
    machines: int
    launches: int


def spread_of(groups: Sequence[Sequence[float]]) -> Spread:
    """One-way random-effects estimate (ANOVA, unbalanced) over each machine's launches: the
    between-machine variance is (MS_between - MS_within) / n0, floored at 0 (launch noise alone
    can spread the means)."""
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


def source_of(
    metrics: ScenarioMetrics, names: Iterable[str], fingerprint: Mapping[str, Any], commit: str | None, at: str
) -> Source:
    """This machine's calibration launches of ``names``, as the pool keeps them."""
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


@dataclass(frozen=True)
class Pooled:
    """What the sources of one entry give: its metric values, tolerances and calibration record."""

    values: dict[str, Any]
    tolerances: dict[str, float]
    calibration: Calibration


def calibrate(
    metrics: ScenarioMetrics,
    defaults: Mapping[str, float],
    profile: HardwareProfile,
    new_source: Source,
    primary: str,
) -> tuple[dict[str, float], Calibration]:
    """Tolerances and calibration record of this machine's launches alone (``--perf-repeats`` >= 2);
    exact metrics keep their default (they do not vary)."""
    if len(metrics.repeats) < 2:
        raise BaselineError("calibration needs at least 2 repeats: pass --perf-repeats N with N >= 2")
    names = calibrated_names(metrics, defaults)
    floors = {n: profile.calibration_floor_of(n) for n in names}
    facts = Facts(floors, profile.machine_spread, profile.timed_on_other_processor, primary)
    found = pooled([new_source], facts)
    exact = {n: tol for n, tol in defaults.items() if not registry.get(n).noisy}
    return {**exact, **found.tolerances}, found.calibration


def pooled(sources: Sequence[Source], facts: Facts) -> Pooled:
    """The pooled metric values, tolerances and calibration record of one entry's sources."""
    names = [n for n in facts.floors if all(n in s["launches"] for s in sources)]
    values: dict[str, Any] = {}
    tolerances: dict[str, float] = {}
    calibrated: dict[str, MetricCalibration] = {}
    for name in names:
        spread = spread_of([s["launches"][name] for s in sources])
        sigma, basis = machine_spread(spread.machine, spread.machines, facts.provisional)
        tolerances[name] = tolerance(spread.cv_launch, sigma, spread.machines, facts.floors[name])
        values[name] = _pooled_value(spread, [s.get("steps", {}).get(name) for s in sources])
        calibrated[name] = MetricCalibration(spread.cv_launch, sigma, basis, spread.machine)
    repeats = sum(len(next(iter(s["launches"].values()), [])) for s in sources)
    return Pooled(values, tolerances, Calibration(facts, calibrated, len(sources), repeats, tuple(sources)))


def _pooled_value(spread: Spread, steps: Sequence[Mapping[str, Any] | None]) -> Any:
    """The pooled baseline value: the machines' mean, with the step samples' spread over all
    machines where each kept one (the Welch test reads it)."""
    if any(s is None for s in steps):
        return float(f"{spread.mean:.6g}")
    parts = [Summary(float(s["mean"]), float(s["std"]), int(s["n"])) for s in steps if s is not None]
    n = sum(p.n for p in parts)
    centre = sum(p.mean * p.n for p in parts) / n
    squares = sum((p.n - 1) * p.std**2 + p.n * (p.mean - centre) ** 2 for p in parts)
    return asdict(Summary(spread.mean, math.sqrt(squares / max(1, n - 1)), n))


def sources_of(entry: BaselineEntry | None) -> list[Source]:
    """The well-formed sources a stored entry holds (none where its calibration keeps none, or after a
    plain update)."""
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


def newest_per_machine(*groups: Iterable[Source]) -> list[Source]:
    """One source per machine: a machine's newest calibration replaces its older ones."""
    newest: dict[str, Source] = {}
    for found in sorted((s for g in groups for s in g), key=lambda s: str(s.get("recorded_at", ""))):
        newest[found["machine"]] = found
    return list(newest.values())


def why_not_poolable(old: BaselineEntry, new: BaselineEntry, theirs: Source, facts: Facts, ours: str) -> str | None:
    """Why source ``theirs`` of ``old`` cannot be pooled with ``new`` (None when it can)."""
    changed = definition.changes(old.extra.get("definition") or {}, new.extra.get("definition") or {})
    if changed:
        return f"the scenario's definition changed since ({'; '.join(changed)})"
    if not facts.across_processors and theirs.get("processor") != ours:
        return f"measured on another processor ({theirs.get('processor')}), whose timing this profile does not compare"
    return None


def pooling_merge(facts: Facts, ours: Source) -> Merge:
    """The merge for :meth:`BaselineStore.record`: this machine's calibration (``ours``, in the new
    entry) pooled with the other machines' sources the stored entry holds, under the file's lock."""

    def pool(old: BaselineEntry | None, new: BaselineEntry) -> BaselineEntry:
        if old is None:
            return new
        kept, dropped = [], []
        for theirs in sources_of(old):
            why = why_not_poolable(old, new, theirs, facts, str(ours["processor"]))
            if why is not None:
                dropped.append(f"{theirs.get('label')}: {why}")
            elif theirs["machine"] != ours["machine"]:
                kept.append(theirs)
        if not kept:
            return with_not_pooled(new, dropped)
        return with_not_pooled(pooled_entry(new, newest_per_machine(kept, [ours]), facts), dropped)

    return pool


def pooled_entry(base: BaselineEntry, sources: Sequence[Source], facts: Facts) -> BaselineEntry:
    """``base`` with its calibrated metrics, tolerances and calibration record pooled over ``sources``."""
    found = pooled(sources, facts)
    return replace(
        base,
        metrics={**base.metrics, **found.values},
        tolerances={**base.tolerances, **found.tolerances},
        extra={**base.extra, CALIBRATION: found.calibration.to_json()},
    )


def with_not_pooled(entry: BaselineEntry, dropped: Sequence[str]) -> BaselineEntry:
    """``entry``, its calibration record saying which earlier machines were left out, and why."""
    if not dropped:
        return entry
    record = Calibration.from_json(entry.extra.get(CALIBRATION) or {})
    return _with_calibration(entry, replace(record, not_pooled=tuple(dropped)))


def pool_ending_merge(at: str) -> Merge:
    """The merge of a plain ``--perf-update-baselines``: the stored calibration keeps its figures
    (its tolerances stay in force) but no longer its sources, which measured the replaced baseline."""

    def end(old: BaselineEntry | None, new: BaselineEntry) -> BaselineEntry:
        stored = new.extra.get(CALIBRATION)
        if not isinstance(stored, Mapping) or "sources" not in stored:
            return new
        why = f"{at}: re-recorded by --perf-update-baselines; the next calibration starts a pool"
        return _with_calibration(new, replace(Calibration.from_json(stored), sources=None, pool_ended=why))

    return end


def _with_calibration(entry: BaselineEntry, record: Calibration) -> BaselineEntry:
    return replace(entry, extra={**entry.extra, CALIBRATION: record.to_json()})
