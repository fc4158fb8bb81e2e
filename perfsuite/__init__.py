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
from typing import TYPE_CHECKING, Any

from perfsuite.core.engines import EngineOptions, EngineSpec, register_engine
from perfsuite.core.metrics import Metric
from perfsuite.core.metrics import register as register_metric
from perfsuite.core.models import ModelSpec
from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.relations import Relation, chain
from perfsuite.core.workloads import (
    BaseScenario,
    Collective,
    DeviceCopy,
    Microbench,
    Scenario,
    ScenarioError,
    Tier,
    TrainerScenario,
)

if TYPE_CHECKING:
    from perfsuite.rank.models.module import Recipe

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
    "Recipe",
    "Relation",
    "Scenario",
    "ScenarioError",
    "Tier",
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


def __getattr__(name: str) -> Any:
    """``Recipe``, what a team's build function returns, imports torch: it is resolved when a model module
    asks for it (in a rank), so importing perfsuite in the pytest process never imports torch."""
    if name == "Recipe":
        from perfsuite.rank.models.module import Recipe

        return Recipe
    raise AttributeError(f"module 'perfsuite' has no attribute {name!r}")
