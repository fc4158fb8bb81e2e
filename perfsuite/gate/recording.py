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
from perfsuite.judge import definition, trustworthy
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
    merge = trustworthy.end_pool(now())
    if result.metrics is not None:
        metrics = baseline_metrics(result.metrics)
        if scenario.picks():
            extra[definition.PICKS] = definition.picked(scenario.picks(), result.metrics)
        if settings.calibrate:
            tolerances, extra[trustworthy.CALIBRATION], merge = calibration(
                scenario, result.metrics, settings, stack, provenance
            )
    entry = store.record(
        scenario.group, scenario.id, result.status, metrics, stack, tolerances=tolerances, extra=extra, merge=merge
    )
    result.baseline = entry
    if not tolerances:
        return Judgement("recorded", f"baseline recorded in {store.path(scenario.group)}")
    calibrated = trustworthy.describe(
        entry.extra[trustworthy.CALIBRATION], scenario.primary, entry.tolerances.get(scenario.primary)
    )
    return Judgement(
        "recorded",
        f"baseline and calibrated tolerances recorded in {store.path(scenario.group)}"
        + (f" ({calibrated})" if calibrated else ""),
    )


def calibration(
    scenario: BaseScenario,
    metrics: ScenarioMetrics,
    settings: RunSettings,
    stack: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> tuple[dict[str, float], dict[str, Any], trustworthy.Merge]:
    """This machine's calibration, and the merge that pools it with the other machines' the stored
    entry holds (:mod:`perfsuite.judge.trustworthy`)."""
    defaults = settings.profile.default_tolerances(scenario.metrics)
    ours = trustworthy.source(
        metrics, trustworthy.calibrated_names(metrics, defaults), stack, provenance.get("commit"), now()
    )
    tolerances, data = trustworthy.calibrate(metrics, defaults, settings.profile, ours, scenario.primary)
    return tolerances, data, trustworthy.rejoin(trustworthy.Facts.of(data), ours)


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
