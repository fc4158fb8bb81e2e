"""``--perf-tier``: which scenarios a run selects by their ``tier`` field.

A team gates its cheap rows on every pull request and runs everything nightly. Tiers are
ordered (:data:`perfsuite.core.workloads.TIERS`, cheapest first): ``--perf-tier pr`` keeps the
``pr`` scenarios, ``--perf-tier nightly`` every one. The others are deselected, as ``-k``
would, so they are neither run nor counted as not judged; so are the relations that would run
one of them. Pytest side, torch-free.
"""

from __future__ import annotations

import pytest

from perfsuite.core.relations import Relation
from perfsuite.core.workloads import TIERS, BaseScenario, tiers_up_to

OPTION = "--perf-tier"


def add_option(group: pytest.OptionGroup) -> None:
    group.addoption(
        OPTION,
        choices=TIERS,
        help=f"run the scenarios of this tier and the cheaper ones ({' < '.join(TIERS)}); default: all",
    )


def deselect(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop (and report as deselected) the scenarios above the selected tier."""
    tier = config.getoption(OPTION)
    if tier is None:
        return
    allowed = tiers_up_to(tier)
    dropped = [item for item in items if _tier(item) not in allowed]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def _tier(item: pytest.Item) -> str:
    """The item's scenario's tier, or a relation's costlier side's (checking a relation runs both of
    its scenarios); a test that is neither runs in every tier."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    scenarios = [params.get("scenario")]
    if isinstance(params.get("relation"), Relation):
        scenarios = [params["relation"].left, params["relation"].right]
    tiers = [TIERS.index(s.tier) for s in scenarios if isinstance(s, BaseScenario)]
    return TIERS[max(tiers, default=0)]
