"""A strategy that silently stops sharding must fail the suite: here a "ZeRO-2"
scenario misconfigured as stage 0, as an engine regression would leave it."""

from __future__ import annotations

import pytest
from conftest import CPU_PROFILE, TINY, TINY_SHAPE

pytest.importorskip("deepspeed", reason="deepspeed is not installed: pip install 'perfsuite[deepspeed]'")

MODULE = f"""
from perfsuite import ModelSpec, Relation, Scenario, parametrize_relations

TINY = {TINY}
DDP = Scenario("shard", "ddp_amp", TINY, {TINY_SHAPE}, precision="bf16")
ZERO2 = Scenario("shard", "zero2_amp", TINY, {TINY_SHAPE}, precision="bf16",
                 strategy="deepspeed_zero", strategy_options={{"stage": STAGE}})

@parametrize_relations([Relation("model_state_bytes_per_rank", ZERO2, "<", DDP)])
def test_relations(perf, relation):
    perf.check_relation(relation)
"""


@pytest.mark.parametrize(("stage", "outcome"), [(2, {"passed": 1}), (0, {"failed": 1})])
def test_unsharded_zero2_fails_its_relation(pytester: pytest.Pytester, stage: int, outcome: dict[str, int]) -> None:
    pytester.makepyfile(test_bench=MODULE.replace("STAGE", str(stage)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE)
    result.assert_outcomes(**outcome)
    if stage == 0:
        result.stdout.fnmatch_lines(["*zero2_amp<ddp_amp: violated: zero2_amp*is NOT less than ddp_amp's*"])
