"""Tiers (issue 39): ``--perf-tier pr`` keeps a pull request's scenarios and drops the nightly ones,
with the relations that would run them; a tier is no part of a scenario's definition."""

from __future__ import annotations

import textwrap

import pytest
from conftest import CPU_PROFILE, TINY, TINY_SHAPE

from perfsuite import ModelSpec, Scenario
from perfsuite.core.workloads import ScenarioError
from perfsuite.judge.definition import definition

MODULE = textwrap.dedent(
    f"""
    from perfsuite import ModelSpec, Relation, Scenario, parametrize, parametrize_relations

    FAST = Scenario("team", "fast", {TINY}, strategy="ddp", {TINY_SHAPE})
    SLOW = Scenario("team", "slow", {TINY}, strategy="ddp", tier="nightly", {TINY_SHAPE})
    OTHER = Scenario("team", "other", {TINY}, strategy="ddp", {TINY_SHAPE})

    @parametrize([FAST, SLOW, OTHER])
    def test_team(perf, scenario):
        perf.check(scenario)

    @parametrize_relations([Relation("peak_mem_mib", FAST, "<", SLOW), Relation("peak_mem_mib", FAST, "<", OTHER)])
    def test_relations(perf, relation):
        perf.check_relation(relation)

    def test_plain():
        pass
    """
)


@pytest.mark.parametrize(
    ("tier", "selected"),
    [
        ("pr", ["team.fast]", "team.other]", "fast<other]", "test_plain"]),
        ("nightly", ["team.fast]", "team.slow]", "team.other]", "fast<slow]", "fast<other]", "test_plain"]),
    ],
)
def test_a_tier_selects_its_scenarios_and_the_relations_among_them(
    pytester: pytest.Pytester, tier: str, selected: list[str]
) -> None:
    pytester.makepyfile(test_team=MODULE)
    done = pytester.runpytest("--collect-only", "-q", CPU_PROFILE, f"--perf-tier={tier}", "-p", "no:cacheprovider")
    ids = [line for line in done.outlines if "::" in line]
    assert len(ids) == len(selected), ids
    for wanted, got in zip(selected, ids, strict=True):
        assert got.endswith(wanted)
    dropped = 6 - len(selected)
    if dropped:
        done.stdout.fnmatch_lines([f"*{len(selected)}/6 tests collected ({dropped} deselected)*"])


def test_a_tier_is_checked_and_is_no_part_of_the_definition() -> None:
    model = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=4096)
    with pytest.raises(ScenarioError, match=r"'team\.x': field 'tier' must be one of pr, nightly, got 'weekly'"):
        Scenario("team", "x", model, tier="weekly")  # type: ignore[arg-type]
    pr, nightly = (Scenario("team", "x", model, tier=t) for t in ("pr", "nightly"))
    assert definition(pr.to_config()) == definition(nightly.to_config())
    assert nightly.to_config()["tier"] == "nightly"
    with pytest.raises(ScenarioError, match="variants"):
        Scenario("team", "x", model, variants={"cpu": {"tier": "nightly"}})
