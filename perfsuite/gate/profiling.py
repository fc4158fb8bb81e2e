"""The session's op profiles: one extra, profiled launch to store beside a recorded
baseline, to diff against it when a scenario regressed, or to list the largest
allocations behind an out-of-memory.

Each is a launch of its own after the measured ones, so a measured number never
carries the profiler's overhead; a gate run that regresses nothing launches
nothing more. ``--perf-op-profiles`` picks when: ``auto`` (the default: store
with baselines, explain regressions and OOMs), ``always`` (explain every
scenario, even one that passed) or ``off``. Pytest side, torch-free.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from perfsuite.core.opprofile import STEPS, OpProfile, merge
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.gate.launching import Launches
from perfsuite.gate.settings import RunSettings
from perfsuite.judge.explain import Explanation
from perfsuite.store.baselines import BaselineError
from perfsuite.store.profilestore import ProfileStore


class OpProfiles:
    """Profiled launches of one session, and the stored profiles of each environment."""

    def __init__(self, settings: RunSettings, launches: Launches, processor: Mapping[str, Any] | None) -> None:
        # processor: this run's where the profile keeps one profile per processor, as its baselines do.
        self.settings, self.launches, self.processor = settings, launches, processor
        self._stores: dict[str, ProfileStore] = {}

    def store_for(self, folder: str) -> ProfileStore:
        """The op profiles beside baselines folder ``folder`` (``<profile>`` or ``<profile>@<env>``)."""
        if folder not in self._stores:
            self._stores[folder] = ProfileStore(self.settings.baselines_dir, folder, self.processor)
        return self._stores[folder]

    def record(self, scenario: BaseScenario, env: str, folder: str) -> str:
        """Profile ``scenario`` and store it beside its baseline; what to add to the verdict's message."""
        profile, why = self._profile(scenario, env, trace=False)
        if profile is None:
            return f"no op profile stored: {why}"
        store = self.store_for(folder)
        store.record(scenario.group, scenario.id, profile)
        return f"op profile stored in {store.path(scenario.group)} (profiler overhead {profile.overhead:+.0%})"

    def explain(self, scenario: BaseScenario, env: str, folder: str) -> Explanation | str:
        """A fresh profile against the stored one (or why there is none)."""
        profile, why = self._profile(scenario, env, trace=True)
        if profile is None:
            return f"op profile: none ({why})"
        store = self.store_for(folder)
        try:
            stored = store.lookup(scenario.group, scenario.id)
        except BaselineError as exc:
            return f"op profile: {exc}"
        note = "" if profile.trace else "no trace kept: over the size cap"
        path = str(store.path(scenario.group))
        return Explanation(profile, stored.profile, path, profile.trace, note, stored.elsewhere)

    def allocations(self, scenario: BaseScenario, env: str) -> str:
        """One launch recording allocations up to its OOM: the largest ones, per failing rank."""
        outcome, folder = self.launches.launch(scenario, env, explain_oom=True)
        lines = []
        for report in outcome.failed_reports:
            summary = report.op_profile
            if report.status != "oom" or summary is None or not summary.ops:
                continue
            where = f" (allocator snapshot: {self._keep(scenario, folder, summary.trace)})" if summary.trace else ""
            shown = ", ".join(
                f"{op.name} {op.alloc_bytes / 2**20:.3g} MiB ({op.calls:.0f} calls)" for op in summary.ops[:5]
            )
            lines.append(f"rank {report.rank} largest allocations before the OOM: {shown}{where}")
        return "\n".join(lines) or f"no allocations recorded before the OOM (that launch ended {outcome.status})"

    # -- launches ---------------------------------------------------------------------
    def _profile(self, scenario: BaseScenario, env: str, trace: bool) -> tuple[OpProfile | None, str]:
        """A profiled launch's ranks merged, with rank 0's trace kept; (None, why) when it gave none."""
        outcome, folder = self.launches.launch(scenario, env, profile_steps=STEPS, trace=trace)
        profiles = [r.op_profile for r in outcome.reports if r.op_profile is not None]
        if outcome.status != "ok":
            return None, f"the profiled launch ended {outcome.status}"
        if len(profiles) != len(outcome.reports) or not profiles:
            return None, f"a {scenario.kind} scenario's ranks report no op profile"
        merged = merge(profiles)
        return replace(merged, trace=self._keep(scenario, folder, merged.trace) if merged.trace else ""), ""

    def _keep(self, scenario: BaseScenario, folder: Path, name: str) -> str:
        """Copy ``name`` from a launch's reports folder into the artifacts folder; its new path."""
        source = folder / name
        if not source.exists():
            return ""
        target = self.settings.artifacts_dir / f"{scenario.id}.{name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return str(target)
