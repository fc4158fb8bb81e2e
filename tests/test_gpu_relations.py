"""Relations only a GPU run can judge (issue 25): seed A2's throughput order of
the sharding engines and A3's rule that more tensor or pipeline parallelism
trades throughput for memory. Fed GPU-profile results that follow the seed
they hold; fed results that break them they are violated; on cpu they skip."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from bench_tests import test_model_state_sharding as a2
from bench_tests import test_parallel_3d as a3
from perfsuite.core.profiles import CPU, gpu_profile
from perfsuite.core.relations import Relation, evaluate
from perfsuite.core.workloads import BaseScenario
from perfsuite.judge.compare import Judgement
from perfsuite.judge.stats import ScenarioMetrics, Summary

H100 = gpu_profile("nvidia-h100-80gb-hbm3-x4")
#: Seed A2 (samples/s) and A3 (samples/s, peak MB), by scenario id.
A2_SEED = {
    "zero1_amp": 12.88,
    "zero2_amp": 10.27,
    "ddp_amp": 9.57,
    "fairscale_sdp_amp": 7.01,
    "fairscale_oss_amp": 6.02,
}
A3_SEED = {
    "tp1_pp1": (9.63, 25061),
    "tp2_pp1": (7.59, 11300),
    "tp4_pp1": (6.16, 5673),
    "tp1_pp2": (8.46, 12375),
    "tp1_pp4": (8.03, 8141),
    "tp2_pp2": (7.37, 6211),
}


@dataclass
class Result:
    scenario: BaseScenario
    metrics: ScenarioMetrics
    status: str = "ok"
    judgement: Judgement = field(default_factory=lambda: Judgement("recorded", ""))


def result(scenario: BaseScenario, samples_per_s: float, peak_mib: float = 1000.0) -> Result:
    values = {"samples_per_s": Summary(samples_per_s, samples_per_s * 0.02, 20), "peak_mem_mib": peak_mib}
    return Result(scenario, ScenarioMetrics(values, step_time_median_s=1.0, step_time_p90_s=1.0, step_times_s=[]))


def gpu_only(relations: Sequence[Relation], metrics: Sequence[str]) -> list[Relation]:
    found = [r for r in relations if r.only_on == ("cuda",) and r.metric in metrics]
    assert found and all(set(r.only_on) & set(H100.variant_keys) for r in found)
    assert not any(set(r.only_on) & set(CPU.variant_keys) for r in found)  # the cpu gate skips them
    return found


def judged(relations: Sequence[Relation], figures: Mapping[str, tuple[float, float]]) -> list[str]:
    outcomes = []
    for rel in relations:
        left, right = (result(s, *figures[s.name]) for s in (rel.left, rel.right))
        outcomes.append(evaluate(rel, left, right).status)
    return outcomes


def test_a2_throughput_order_holds_on_the_seeds_figures_and_fails_when_zero2_outruns_zero1() -> None:
    order = gpu_only([r for r in a2.RELATIONS if r.op == ">" and r.left not in a2.BEST_ROWS], ["samples_per_s"])
    assert [(r.left.name, r.right.name) for r in order] == list(zip(list(A2_SEED), list(A2_SEED)[1:], strict=False))
    seed = {name: (value, 1000.0) for name, value in A2_SEED.items()}
    assert judged(order, seed) == ["holds"] * 4
    swapped = {**seed, "zero1_amp": (10.0, 1000.0), "zero2_amp": (10.27, 1000.0)}
    assert judged(order, swapped) == ["violated", "holds", "holds", "holds"]


@pytest.mark.parametrize("metric", ["samples_per_s", "peak_mem_mib"])
def test_a3_more_tp_or_pp_trades_throughput_for_memory(metric: str) -> None:
    trade = gpu_only([r for r in a3.RELATIONS if r.left not in a3.BEST_ROWS], [metric])
    assert len(trade) == 5  # tp 1>2>4, pp 1>2>4, tp2 pp 1>2
    assert judged(trade, A3_SEED) == ["holds"] * 5
    # A stack where pipeline stages cost no throughput and hold no less memory breaks the rule.
    flat = {**A3_SEED, "tp1_pp2": A3_SEED["tp1_pp1"]}
    assert judged(trade, flat).count("violated") == 1


def test_each_best_practice_row_must_beat_its_seed_row_on_gpus_only() -> None:
    from bench_tests import test_graph_optimization as a4
    from bench_tests import test_mixed_precision as a1

    for group, seed in ((a1, a1.AMP), (a4, a4.AMP), (a2, a2.DDP_AMP), (a3, a3.TP1_PP1)):
        for best in group.BEST_ROWS:
            assert best.reference.startswith("no seed row: best-practice counterpart") and best.only_on == ("cuda",)
            (rule,) = [r for r in gpu_only(group.RELATIONS, ["samples_per_s"]) if r.left is best]
            assert (rule.op, rule.right) == (">", seed)
            assert judged([rule], {best.name: (2.0, 1000.0), seed.name: (1.0, 1000.0)}) == ["holds"]
            assert judged([rule], {best.name: (1.0, 1000.0), seed.name: (1.0, 1000.0)}) == ["violated"]
