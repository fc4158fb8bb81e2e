"""perfsuite: a pytest plugin that gates training speed and memory of
distributed deep-learning stacks against per-hardware baselines.

Declare scenarios as data and test them with the ``perf`` fixture::

    from perfsuite import ModelSpec, Scenario, parametrize

    SCENARIOS = [Scenario("my_group", "fp32", ModelSpec("bert", 12, 768, 12), ...)]

    @parametrize(SCENARIOS)
    def test_my_group(perf, scenario):
        perf.check(scenario)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfsuite.engines import EngineOptions, EngineSpec, register_engine
from perfsuite.metrics import Metric
from perfsuite.metrics import register as register_metric
from perfsuite.models import ModelSpec
from perfsuite.profiles import HardwareProfile
from perfsuite.relations import Relation, chain
from perfsuite.workloads import (
    BaseScenario,
    Collective,
    DeviceCopy,
    Microbench,
    Scenario,
    ScenarioError,
    TrainerScenario,
)

__all__ = [
    "BaseScenario",
    "Collective",
    "DeviceCopy",
    "EngineOptions",
    "EngineSpec",
    "HardwareProfile",
    "Metric",
    "Microbench",
    "ModelSpec",
    "Relation",
    "Scenario",
    "ScenarioError",
    "TrainerScenario",
    "chain",
    "parametrize",
    "parametrize_relations",
    "register_engine",
    "register_metric",
]


def parametrize(scenarios: Sequence[BaseScenario]) -> Any:
    """``pytest.mark.parametrize("scenario", ...)`` with each scenario's id as test id."""
    import pytest

    ids = [s.id for s in scenarios]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ScenarioError(f"duplicate scenario ids {duplicates}: ids are baseline keys and must be unique")
    return pytest.mark.parametrize("scenario", list(scenarios), ids=ids)


def parametrize_relations(relations: Sequence[Relation]) -> Any:
    """``pytest.mark.parametrize("relation", ...)`` with each relation's id as test id."""
    import pytest

    return pytest.mark.parametrize("relation", list(relations), ids=[r.id for r in relations])
