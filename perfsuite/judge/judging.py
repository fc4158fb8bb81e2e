"""Judging one measurement against its baseline, and the notes that say how a
verdict came about.

``judge`` turns a :class:`~perfsuite.judge.results.Measurement` and the stored
baseline into a :class:`~perfsuite.judge.compare.Judgement`: a failed launch is an
error, a changed scenario ``definition_changed``, a throttled or too-spread
measurement ``unreliable``, and a regression measured under contention
``unreliable`` too (a busy host, not the stack, is the likely cause). A
baseline from another processor or card is named beside the verdict, and on a
profile that compares no timings across processors (cpu) a row's timing is not
judged then: ``other_machine``, its memory still judged. The
session decides how often to measure (confirmation, contention retries); the
helpers below word what those extra measurements showed. Pytest side,
torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.judge import definition
from perfsuite.judge.compare import (
    FAMILY_ALPHA,
    FamilyFloor,
    Judgement,
    MetricCheck,
    Note,
    judge_imbalance,
    judge_metrics,
    judge_outcome,
    resolve_tolerances,
)
from perfsuite.judge.contention import Quiet, contended
from perfsuite.judge.results import Measurement
from perfsuite.judge.stats import ScenarioMetrics
from perfsuite.judge.trustworthy import untrustworthy
from perfsuite.launch import identity
from perfsuite.launch.fingerprint import stack_changes
from perfsuite.launch.identity import MachineChange
from perfsuite.store.baselines import BaselineEntry


def judge(
    scenario: BaseScenario,
    measurement: Measurement,
    baseline: BaselineEntry | None,
    profile: HardwareProfile,
    compare: Callable[[MetricCheck], MetricCheck],
    fingerprint: Callable[[], dict[str, Any]],
    family: FamilyFloor | None = None,
) -> Judgement:
    """The verdict on one measurement. ``fingerprint`` gives the stack it ran on; it is
    called only when there is a baseline to compare with (probing another
    environment's stack takes a subprocess). ``family``: the floor of a run that judges several
    rows' timing (:func:`family_tolerances`)."""
    outcome, metrics = measurement.outcome, measurement.metrics
    if outcome.status == "skipped":
        return Judgement("skipped", outcome.skip_reason)
    if outcome.status in ("crash", "timeout"):
        detail = outcome.failure.describe() if outcome.failure else ""
        return Judgement("error", f"workers {outcome.status}: {detail}")
    changed = redefined(scenario, baseline)
    if changed is not None:
        return changed
    expected = baseline.expected if baseline else scenario.expected_outcome(profile.variant_keys)
    decided = judge_outcome(outcome.status, expected, baseline, profile.memory_limit())
    if (decided is not None and decided.verdict != "no_baseline") or metrics is None:
        return decided or Judgement("error", "no metrics")
    distrust = untrustworthy(metrics)
    if distrust is not None:
        return Judgement("unreliable", distrust)
    if decided is not None or baseline is None:
        return decided or Judgement("no_baseline", "no baseline recorded")
    current = fingerprint()
    machine = identity.compare(baseline.fingerprint, current)
    judgement = against(scenario, metrics, baseline, profile, compare, machine, family)
    # Every verdict against a baseline names the machine that recorded it, when it is another.
    said = judgement.message
    for note in (n for n in machine.notes() if n not in said):
        judgement = judgement.noted(Note("machine", note))
    return replace(judgement, stack_changes=tuple(stack_changes(baseline.fingerprint, current)))


def against(
    scenario: BaseScenario,
    metrics: ScenarioMetrics,
    baseline: BaselineEntry,
    profile: HardwareProfile,
    compare: Callable[[MetricCheck], MetricCheck],
    machine: identity.Identity,
    family: FamilyFloor | None = None,
) -> Judgement:
    """The verdict on trustworthy metrics against their baseline."""
    own = resolve_tolerances(profile.default_tolerances(scenario.metrics), scenario.tolerances, baseline)
    tolerances = family_tolerances(own, family)
    unpicked = definition.unpicked(scenario.picks(), metrics, baseline.extra.get(definition.PICKS))
    judged = [name for name in scenario.metrics if unpicked is None or name not in unpicked.metrics]
    elsewhere = None if profile.timed_on_other_processor else machine.of("processor")
    if elsewhere is not None:
        judgement = judge_elsewhere(scenario, metrics, baseline, tolerances, compare, judged, elsewhere)
        return _unjudged(judgement, unpicked)
    busy = contention_of(metrics, profile)
    primary = metrics.summary(scenario.primary)
    if primary is not None and primary.cv > profile.max_cv:
        # Name the contention when it was measured: it is the likely cause of the spread.
        cause = f"measured under contention ({busy})" if busy else "busy or throttled machine?"
        return Judgement(
            "unreliable",
            f"{scenario.primary} varies too much to judge: CV {primary.cv:.1%} over this "
            f"profile's limit {profile.max_cv:.0%} ({cause})",
        )
    judgement = judge_metrics(metrics, baseline, tolerances, compare, judged)
    held = family_held(judgement, own, family)
    judgement = judgement.noted(held) if held is not None else judgement
    if judgement.verdict == "regression":
        doubt = regression_doubt(scenario, metrics, baseline, profile, judgement, busy)
        if doubt is not None:
            return replace(judgement, verdict="unreliable").noted(doubt)
    else:
        judgement = judge_imbalance(metrics, scenario.max_imbalance) or judgement
    return _unjudged(judgement, unpicked)


def family_tolerances(tolerances: dict[str, float], family: FamilyFloor | None) -> dict[str, float]:
    """The tolerances of a row's timed metrics in a run that judges several rows' timing: each raised
    to the family's floor, so the run as a whole fails at most ``FAMILY_ALPHA`` of unchanged runs.
    Memory and byte counts never move."""
    if family is None:
        return tolerances
    timed = {name for name in tolerances if name in registry.METRICS and registry.METRICS.get(name).timed}
    return {name: max(value, family.floor) if name in timed else value for name, value in tolerances.items()}


def family_held(judgement: Judgement, own: Mapping[str, float], family: FamilyFloor | None) -> Note | None:
    """A note where a loss beyond a metric's own tolerance passed because the run judges many rows."""
    if family is None:
        return None
    for check in judgement.checks:
        worse = check.worse
        raised = check.tolerance > own.get(check.metric, check.tolerance)
        if check.outcome == "pass" and raised and own[check.metric] < worse <= check.tolerance:
            return Note(
                "family",
                f"{check.metric} lost {worse:.1%}, beyond its own {own[check.metric]:.1%} but within "
                f"{check.tolerance:.1%}, the loss this run of {family.rows} timing-judged rows needs so that an "
                f"unchanged run fails none of them in {1 - FAMILY_ALPHA:.0%} of runs",
                "clause",
            )
    return None


def regression_doubt(
    scenario: BaseScenario,
    metrics: ScenarioMetrics,
    baseline: BaselineEntry,
    profile: HardwareProfile,
    judgement: Judgement,
    busy: str | None,
) -> Note | None:
    """Why a regression is not judged one: the contention it was measured under, or a primary metric
    whose step-to-step spread grew since the baseline (None: nothing doubts it)."""
    if busy is not None:
        return Note("contention", f"measured under contention ({busy}), so not judged a regression:", "before")
    # A grown step-to-step spread doubts a slower primary metric only: memory does not jitter with the host.
    if not any(c.metric == scenario.primary and c.outcome == "regression" for c in judgement.checks):
        return None
    grew = spread_grew(scenario, metrics, baseline, profile)
    return Note("spread", f"{grew}, so not judged a regression:", "before") if grew is not None else None


def _unjudged(judgement: Judgement, unpicked: definition.Unpicked | None) -> Judgement:
    """``judgement``, noting why some metrics were not judged (``unpicked``, None when all were)."""
    return judgement.noted(Note("unjudged", unpicked.reason)) if unpicked is not None else judgement


def judge_elsewhere(
    scenario: BaseScenario,
    metrics: ScenarioMetrics,
    baseline: BaselineEntry,
    tolerances: Mapping[str, float],
    compare: Callable[[MetricCheck], MetricCheck],
    judged: list[str],
    change: MachineChange,
) -> Judgement:
    """A baseline from another processor, on a profile that does not compare timings across
    processors: memory and byte counts are judged, timed metrics are not. ``other_machine``
    unless the memory regressed; never a regression of speed."""
    timed = [name for name in judged if registry.get(name).timed]
    judgement = judge_metrics(metrics, baseline, tolerances, compare, [n for n in judged if n not in timed])
    timed = [name for name in timed if name in tolerances]  # those a baseline here would have judged
    unjudged = f"{', '.join(timed) or 'timing'} not judged, {change.describe()}"
    if judgement.verdict == "regression":  # memory grew: no advice to re-record, which would accept it
        return judgement.noted(Note("unjudged", unjudged))
    # A straggler rank is this run's own imbalance, whichever machine recorded the baseline.
    straggler = judge_imbalance(metrics, scenario.max_imbalance)
    if straggler is not None:
        return replace(straggler, checks=judgement.checks).noted(Note("unjudged", unjudged))
    shown = ", ".join(c.metric for c in judgement.checks) or "nothing else measured here"
    return Judgement(
        "other_machine",
        f"{unjudged}. Timing measured on another processor is not comparable: record this machine's baselines "
        f"(pytest -k '{scenario.id}' --perf-update-baselines) or compare with a revision on this machine "
        f"(python -m perfsuite ab-rev HEAD~1 -k '{scenario.id}'). Judged: {shown}: {judgement.message}",
        judgement.checks,
    )


def redefined(scenario: BaseScenario, baseline: BaselineEntry | None) -> Judgement | None:
    """``definition_changed`` when the scenario is no longer what its baseline was recorded for
    (None when it is, or when the baseline predates stored definitions)."""
    recorded = baseline.extra.get("definition") if baseline is not None else None
    if not isinstance(recorded, Mapping):
        return None
    changed = definition.changes(recorded, definition.definition(scenario.to_config()))
    if not changed:
        return None
    return Judgement(
        "definition_changed",
        f"the scenario changed since its baseline was recorded ({'; '.join(changed)}), so its figures are "
        f"not comparable; re-record it: pytest -k '{scenario.id}' --perf-update-baselines",
    )


#: Per-step spread a grown spread must also exceed: under it, even a several-fold
#: growth leaves the mean as well known as the tolerance needs.
SPREAD_GROWTH_FLOOR = 0.02


def spread_grew(
    scenario: BaseScenario, metrics: ScenarioMetrics, baseline: BaselineEntry, profile: HardwareProfile
) -> str | None:
    """Why the primary metric's step-to-step spread says the machine changed since the
    baseline (None if it does not, or either side lacks a spread)."""
    growth, now = profile.max_spread_growth, metrics.summary(scenario.primary)
    stored = baseline.metrics.get(scenario.primary)
    if growth is None or now is None or not isinstance(stored, Mapping) or not stored.get("mean"):
        return None
    then = float(stored.get("std", 0.0)) / float(stored["mean"])
    if now.cv <= max(growth * then, SPREAD_GROWTH_FLOOR):
        return None
    return (
        f"{scenario.primary} spreads {now.cv:.1%} step to step against {then:.1%} when its baseline was "
        f"recorded (over {growth:g}x): the machine is not in the state its baseline describes"
    )


def contention_of(metrics: ScenarioMetrics, profile: HardwareProfile) -> str | None:
    """Why ``metrics`` were measured under contention by this profile's limits (None if they were not)."""
    return contended(metrics.contention, profile.max_foreign_cores, profile.max_steal_cores)


# -- notes on a verdict that took more than one measurement --------------------
def confirmed(judgement: Judgement, attempts: list[dict[str, Any]], primary: str) -> Judgement:
    """A regression that every confirmation reproduced, with the primary metric of each measurement."""
    seen = ", ".join(f"{_mean(a[primary]):.4g}" for a in attempts if a[primary] is not None)
    note = f"confirmed by {len(attempts) - 1} fresh measurement(s); {primary} per measurement: {seen}"
    return judgement.noted(Note("confirmation", note))


def unconfirmed(judgement: Judgement, attempts: list[dict[str, Any]]) -> Judgement:
    """The confirmation's verdict, saying which earlier measurement looked like a regression."""
    first = next(a for a in attempts if a["verdict"] == "regression")
    if judgement.verdict == "unreliable":  # the confirmation could not be judged: neither noise nor a regression
        outcome = "could not be judged, so neither is"
    else:
        outcome = "did not reproduce it: treated as noise"
    note = (
        f"a measurement looked like a regression ({first['message']}) but confirmation "
        f"measurement {len(attempts) - 1} {outcome}."
    )
    return judgement.noted(Note("confirmation", note, "before"))


def still_contended(judgement: Judgement, busy: list[str], waited: Quiet | None, retries: int) -> Judgement:
    """An unreliable verdict that names the contention of every try and why it stopped trying."""
    if waited is not None:
        last = f"{waited.last.foreign_cores:.2f} cores busy" if waited.last else "no sample"
        stop = f"the host did not go quiet within {waited.waited_s:.0f} s ({last})"
    elif len(busy) > retries:
        stop = f"all {len(busy)} measurement(s) contended (--perf-contention-retries {retries})"
    else:
        stop = "the session's wait budget for a quiet host is spent (--perf-contention-budget)"
    return judgement.noted(Note("contention", f"{stop}; {_tries(busy)}"))


def remeasured(judgement: Judgement, busy: list[str]) -> Judgement:
    """A verdict reached once the host went quiet, naming the contention of the tries before."""
    return judgement.noted(Note("contention", f"measured again after the host went quiet; {_tries(busy)}"))


def _tries(busy: list[str]) -> str:
    return "; ".join(f"try {n}: {why}" for n, why in enumerate(busy, 1))


def _mean(stored: Any) -> float:
    return float(stored["mean"] if isinstance(stored, dict) else stored)
