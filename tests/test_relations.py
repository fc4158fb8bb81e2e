from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from perfsuite import ModelSpec, Relation, Scenario, ScenarioError, chain
from perfsuite.core.relations import evaluate
from perfsuite.judge.compare import Judgement
from perfsuite.judge.stats import ScenarioMetrics, Summary

TINY = ModelSpec("gpt2", layers=1, hidden=32, heads=2, vocab=512, max_positions=64)
A, B, C = (Scenario("g", n, TINY, world_size=2, micro_batch=1, global_batch=2, seq_len=8) for n in "abc")


@dataclass
class Fake:
    scenario: Scenario
    status: str
    metrics: ScenarioMetrics | None
    judgement: Judgement = field(default_factory=lambda: Judgement("pass", ""))


def result(scenario: Scenario, throughput: float, optimizer: int, status: str = "ok") -> Fake:
    values = {
        "samples_per_s": Summary(throughput, 1, 5),
        "peak_mem_mib": 100.0,
        "model_state_bytes_per_rank": 20 + optimizer,
        "model_state.optimizer": optimizer,
    }
    metrics = ScenarioMetrics(values, step_time_median_s=0.1, step_time_p90_s=0.1, step_times_s=[])
    return Fake(scenario, status, metrics if status == "ok" else None)


def test_strict_relation_holds_and_is_violated() -> None:
    rel = Relation("model_state_bytes_per_rank", A, ">", B)
    assert evaluate(rel, result(A, 1, 80), result(B, 1, 40)).status == "holds"
    outcome = evaluate(rel, result(A, 1, 40), result(B, 1, 40))
    assert outcome.status == "violated" and "NOT greater than" in outcome.message


def test_world_size_factor_for_sharded_optimizer_states() -> None:
    rel = Relation("model_state.optimizer", A, "~", B, factor="1/world_size", tolerance=0.05)
    assert evaluate(rel, result(A, 1, 50), result(B, 1, 100)).status == "holds"
    assert evaluate(rel, result(A, 1, 100), result(B, 1, 100)).status == "violated"


def test_relation_with_a_run_that_did_not_train_is_skipped() -> None:
    rel = Relation("samples_per_s", A, ">", B)
    outcome = evaluate(rel, result(A, 1, 1), result(B, 1, 1, status="oom"))
    assert outcome.status == "skipped" and "g.b did not train (oom" in outcome.message


def test_chain_and_ids() -> None:
    relations = chain("model_state_bytes_per_rank", ">", [A, B, C])
    assert [r.id for r in relations] == [
        "g.model_state_bytes_per_rank:a>b",
        "g.model_state_bytes_per_rank:b>c",
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"metric": "latency"}, "metric"),
        ({"op": ">="}, "op"),
        ({"op": "~", "tolerance": 0}, "tolerance"),
        ({"only_on": "cuda"}, "only_on"),
    ],
)
def test_bad_relation_names_the_field(kwargs: dict, field: str) -> None:
    fields = {"metric": "samples_per_s", "left": A, "op": ">", "right": B, **kwargs}
    with pytest.raises(ScenarioError, match=f"field '{field}'"):
        Relation(**fields)


def test_scaling_factor_reports_and_gates_the_scaling_efficiency() -> None:
    one, four = A.at_world_size(1), A.at_world_size(4)
    rel = Relation("samples_per_s", four, ">", one, factor="scaling", efficiency=0.7)
    assert rel.id == "g.samples_per_s:a>0.7*scaling*a"
    good = evaluate(rel, result(four, 300, 1), result(one, 100, 1))
    assert good.status == "holds" and "scaling efficiency 75% (4x ranks), required 70%" in good.message
    # The seed's anomaly: more GPUs, slower per sample than one.
    bad = evaluate(rel, result(four, 90, 1), result(one, 100, 1))
    assert bad.status == "violated" and "scaling efficiency 22%" in bad.message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"factor": "2/world_size"}, "'factor' must be"), ({"efficiency": 0.5}, "'efficiency' must be")],
)
def test_bad_factor_or_efficiency_names_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Relation("samples_per_s", A, ">", B, **kwargs)
