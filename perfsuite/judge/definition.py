"""What a baseline was recorded for, and whether the scenario is still that.

A baseline keeps the scenario's resolved definition: its fields after fitting
to the profile (model shape, precision, batches, world size, engine options),
taken from the scenario itself, never from the built model. When a scenario's
definition has changed since, its figures are not comparable with the
baseline, so the scenario fails as ``definition_changed``, naming the changed
fields, rather than passing or calling the change a regression. Pytest side,
torch-free.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.judge.stats import ScenarioMetrics
from perfsuite.store.vcs import current_commit

#: Config keys that describe or measure rather than define the work: notes and
#: formula texts, names, the spec before fitting, what is derived from the
#: rest, how many steps are measured, and when a workflow runs it (its tier).
NOT_DEFINING = frozenset(
    {
        "reference",
        "flops_formula",
        "bytes_formula",
        "declared",
        "layout",
        "bus_factor",
        "id",
        "group",
        "name",
        "primary",
        "steps",
        "warmup_steps",
        "max_warmup_steps",
        "tier",
        "min_effect",
        "judge_work",
    }
)


def definition(config: Mapping[str, Any]) -> dict[str, Any]:
    """The defining part of a scenario's config (``BaseScenario.to_config()``)."""
    return {key: value for key, value in config.items() if key not in NOT_DEFINING}


#: Mappings whose keys are the user's (a transformers config's overrides, an engine's options):
#: a key one side lacks is a change of the scenario, not of perfsuite's version.
USER_KEYED = frozenset({"config", "strategy_options"})
_UNSET = object()


def changes(
    recorded: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "", every: bool = False
) -> list[str]:
    """Each field that differs, as ``model.ffn 512 -> 2048``.

    Only fields on both sides count: a field one side lacks comes from a
    perfsuite version that wrote more or fewer of them, not from the scenario.
    Inside a :data:`USER_KEYED` mapping (``every``) every key counts, a missing one shown as unset.
    """
    found = []
    keys = set(recorded) | set(current) if every else set(recorded) & set(current)
    for key in sorted(keys):
        old, new = recorded.get(key, _UNSET), current.get(key, _UNSET)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            found += changes(old, new, f"{prefix}{key}.", every or key in USER_KEYED)
        elif old != new:
            found.append(f"{prefix}{key} {_show(old)} -> {_show(new)}")
    return found


#: The baseline entry's key for what its rank picked at run time (``BaseScenario.picks``).
PICKS = "picks"


#: What a baseline keeps for a pick its launches did not agree on: no later pick matches it.
VARIED = "varied between launches"


def picked(picks: Mapping[str, tuple[str, ...]], metrics: ScenarioMetrics) -> dict[str, Any]:
    """What a measurement's rank picked (rank 0's detail), for its baseline entry."""
    return {key: VARIED if key in metrics.detail_varies else metrics.detail.get(key) for key in picks}


@dataclass(frozen=True)
class Unpicked:
    """Metrics a baseline cannot judge, and why: the rank picked otherwise than its baseline's."""

    metrics: frozenset[str]
    reason: str


def unpicked(picks: Mapping[str, tuple[str, ...]], metrics: ScenarioMetrics, recorded: Any) -> Unpicked | None:
    """The metrics a baseline cannot judge because the rank picked otherwise than the
    baseline's rank (or the baseline does not say what that picked, or this measurement's
    launches picked differently), and why (None when it can judge them all)."""
    stored = recorded if isinstance(recorded, Mapping) else {}
    found: set[str] = set()
    reasons = []
    for key, dependent in picks.items():
        now, then = metrics.detail.get(key), stored.get(key)
        if key in metrics.detail_varies:
            reasons.append(f"this measurement's launches picked different {key}s")
        elif then is None:
            reasons.append(f"its baseline predates recording the rank's {key} (re-record it to judge them)")
        elif now != then:
            reasons.append(f"the rank picked {key} {_show(now)}, its baseline's rank {_show(then)}")
        else:
            continue
        found.update(dependent)
    if not found:
        return None
    return Unpicked(frozenset(found), f"{', '.join(sorted(found))} not judged: {'; '.join(reasons)}")


def _show(value: Any) -> str:
    if value is _UNSET:
        return "(unset)"
    return repr(value) if isinstance(value, str) else str(value)


def provenance(folder: Path) -> dict[str, Any]:
    """Where a baseline comes from besides its fingerprint: the perfsuite version, and the git
    commit of the checkout holding ``folder`` and whether it had uncommitted changes (None
    and False outside git, or without git)."""
    try:
        version: str | None = importlib.metadata.version("perfsuite")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = None
    commit = current_commit(folder)
    return {"perfsuite": version, "commit": commit.id, "dirty": commit.dirty}
