"""Recording a scenario's result as its baseline (``--perf-update-baselines``,
``--perf-calibrate``).

The entry keeps the measured metrics, the stack's fingerprint, the scenario's
definition (so a later change is caught as ``definition_changed``), where it
was recorded from, and on request calibrated tolerances. An OOM that nothing
expects is refused rather than recorded: recorded silently, the gate would
pass that OOM from then on. Pytest side, torch-free.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from perfsuite.core.workloads.base import BaseScenario
from perfsuite.gate.settings import RunSettings
from perfsuite.judge import calibration, definition
from perfsuite.judge.compare import Judgement
from perfsuite.judge.results import ScenarioResult, baseline_metrics
from perfsuite.judge.stats import ScenarioMetrics
from perfsuite.store.baselines import BaselineStore


def refused_oom(scenario: BaseScenario, result: ScenarioResult, settings: RunSettings) -> Judgement | None:
    """An OOM that neither the scenario nor its stored baseline expects is not recorded,
    unless ``--perf-accept-oom`` names it: recorded silently, the gate would pass that OOM from then on."""
    if result.status != "oom" or scenario.id in settings.accept_oom:
        return None
    stored = result.baseline is not None and result.baseline.expected == "oom"
    if stored or scenario.expected_outcome(settings.profile.variant_keys) == "oom":
        return None
    return Judgement(
        "unexpected_oom",
        "ran out of memory where it should fit, so no baseline was recorded (the stored one is unchanged). "
        f"If the new footprint is intended, record the OOM as expected: --perf-update-baselines "
        f"--perf-accept-oom {scenario.id}",
    )


def record(
    scenario: BaseScenario,
    result: ScenarioResult,
    store: BaselineStore,
    settings: RunSettings,
    provenance: dict[str, Any],
    fingerprint: Callable[[], dict[str, Any]],
) -> Judgement:
    """Write ``result`` into ``store`` as the scenario's baseline (and set it as the result's
    baseline). ``fingerprint`` gives the stack it ran on, read only once the entry is complete."""
    metrics: dict[str, Any] = {}
    tolerances: dict[str, float] | None = None
    extra: dict[str, Any] = {}
    if result.status == "oom" and scenario.id in settings.accept_oom:
        extra["oom_accepted"] = {"by": who(), "at": now(), "via": "--perf-accept-oom"}
    extra["definition"] = definition.definition(scenario.to_config())
    extra["provenance"] = provenance
    stack = fingerprint()
    merge = calibration.pool_ending_merge(now())
    if result.metrics is not None:
        metrics = baseline_metrics(result.metrics)
        if scenario.picks():
            extra[definition.PICKS] = definition.picked(scenario.picks(), result.metrics)
        if settings.calibrate:
            tolerances, record, merge = calibrated(scenario, result.metrics, settings, stack, provenance)
            extra[calibration.CALIBRATION] = record.to_json()
    entry = store.record(
        scenario.group, scenario.id, result.status, metrics, stack, tolerances=tolerances, extra=extra, merge=merge
    )
    result.baseline = entry
    if not tolerances:
        return Judgement("recorded", f"baseline recorded in {store.path(scenario.group)}")
    # The entry written may pool other machines' sources: describe what was stored, not this machine's alone.
    stored = calibration.Calibration.from_json(entry.extra[calibration.CALIBRATION])
    described = stored.describe(scenario.primary, entry.tolerances.get(scenario.primary))
    return Judgement(
        "recorded",
        f"baseline and calibrated tolerances recorded in {store.path(scenario.group)}"
        + (f" ({described})" if described else ""),
    )


def calibrated(
    scenario: BaseScenario,
    metrics: ScenarioMetrics,
    settings: RunSettings,
    stack: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> tuple[dict[str, float], calibration.Calibration, calibration.Merge]:
    """This machine's calibrated tolerances and calibration record, and the merge that pools it with
    the other machines' the stored entry holds (:mod:`perfsuite.judge.calibration`)."""
    defaults = settings.profile.default_tolerances(scenario.metrics)
    names = calibration.calibrated_names(metrics, defaults)
    ours = calibration.source_of(metrics, names, stack, provenance.get("commit"), now())
    tolerances, record = calibration.calibrate(metrics, defaults, settings.profile, ours, scenario.primary)
    return tolerances, record, calibration.pooling_merge(record.facts, ours)


def who() -> str:
    """Who accepted something into a baseline: the login, and the CI job where there is one."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = f"uid {os.getuid()}"
    job = os.environ.get("GITHUB_RUN_ID") or os.environ.get("CI_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    return f"{user} (job {job})" if job else user


def now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()
