"""The metric registry (issue: one entry per metric): entries are validated,
scenarios may only name metrics their kind produces, and a metric that a user
registers is recorded, gated and reported by the same code as the built-ins."""

from __future__ import annotations

import json
import textwrap

import pytest

from perfsuite import Metric, ModelSpec, Relation, Scenario, ScenarioError
from perfsuite.core.metrics import METRICS, MetricError, MetricRegistry

TINY = ModelSpec("bert", layers=1, hidden=32, heads=2, vocab=512, max_positions=64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Bad Name"}, "lowercase words"),
        ({"direction": "up"}, "direction must be one of"),
        ({"source": "steps"}, "combines ranks by 'slowest_step'"),
        ({"spread": True}, "spread needs source 'steps'"),
        ({"tolerances": {"cpu": 1.5}}, r"tolerances\['cpu'\] must be in \[0, 1\)"),
    ],
)
def test_bad_metric_entry_is_refused(kwargs: dict[str, object], message: str) -> None:
    fields = {"name": "x_per_s", "unit": "x/s", "direction": "higher", "noisy": True, **kwargs}
    with pytest.raises(MetricError, match=message):
        Metric(**fields)  # type: ignore[arg-type]


def test_a_name_cannot_be_registered_twice_with_different_rules() -> None:
    registry = MetricRegistry()
    first = Metric("gbps", "GB/s", "higher", noisy=True)
    assert registry.register(first) is first and registry.register(first) is first
    with pytest.raises(MetricError, match="already registered"):
        registry.register(Metric("gbps", "GB/s", "lower", noisy=True))


def test_builtin_entries_carry_the_default_gate() -> None:
    samples = METRICS.get("samples_per_s")
    assert samples.source == "steps" and samples.spread and samples.tolerances == {"cpu": 0.40, "cuda": 0.05}
    assert not METRICS.get("model_state_bytes_per_rank").noisy
    assert METRICS.get("tokens_per_s").tolerances == {}  # recorded, not gated by default


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tolerances": {"gbps_nowhere": 0.1}}, "tolerances"),
        ({"max_imbalance": {"tokens_per_s": 1.5}}, "max_imbalance"),
    ],
)
def test_scenarios_may_only_name_metrics_their_kind_produces(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError, match=f"field '{field}'"):
        Scenario("g", "n", TINY, world_size=2, micro_batch=1, global_batch=2, seq_len=16, **overrides)  # type: ignore[arg-type]


def test_relation_metric_must_be_produced_by_both_sides() -> None:
    a = Scenario("g", "a", TINY, world_size=2, micro_batch=1, global_batch=2, seq_len=16)
    b = Scenario("g", "b", TINY, world_size=2, micro_batch=1, global_batch=2, seq_len=16)
    assert Relation("tokens_per_s", a, ">", b).metric == "tokens_per_s"
    with pytest.raises(ScenarioError, match="field 'metric'"):
        Relation("latency_ms", a, ">", b)


# A workload kind and a metric of the user's own: an all-reduce bus bandwidth
# benchmark (nccl-tests' busbw: bytes x 2(n-1)/n per all-reduce). The declaring
# module is torch-free, as the pytest process needs; the runner imports torch.
KIND = """
from dataclasses import dataclass
from typing import ClassVar

from perfsuite import BaseScenario, Metric, register_metric
from perfsuite.core.protocol import WorkloadSpec

register_metric(Metric(
    "allreduce_busbw_gbps", "GB/s", "higher", noisy=True, source="steps", across_ranks="slowest_step",
    across_launches="pool", spread=True, tolerances={"cpu": 0.8},
))

@dataclass(frozen=True)
class AllReduceSpec(WorkloadSpec):
    runner: ClassVar[str] = "allreduce_rank:AllReduceRunner"
    elements: int

@dataclass(frozen=True)
class AllReduce(BaseScenario):
    kind: ClassVar[str] = "allreduce"
    metrics: ClassVar[tuple[str, ...]] = ("allreduce_busbw_gbps", "peak_mem_mib")
    primary: ClassVar[str] = "allreduce_busbw_gbps"
    elements: int = 2**22  # 16 MiB: steps long enough that scheduler jitter stays small

    def step_work(self):
        n = self.world_size
        return {"allreduce_busbw_gbps": 4 * self.elements * 2 * (n - 1) / n / 1e9}

    def rank_spec(self):
        return AllReduceSpec(id=self.id, world_size=self.world_size, warmup_steps=self.warmup_steps,
                             max_warmup_steps=self.warmup_limit, steps=self.steps, elements=self.elements)
"""
RUNNER = """
import torch
import torch.distributed as dist

from perfsuite.core.protocol import RankReport
from perfsuite.rank.worker.base import Runner
from perfsuite.rank.worker.loop import measure

class AllReduceRunner(Runner):
    def run(self, ctx, reporter):
        data = torch.ones(self.job.spec.elements, device=ctx.device)
        result = measure(lambda last: dist.all_reduce(data), self.job, ctx, reporter)
        return RankReport(rank=ctx.rank, status="ok", step_times_s=tuple(result.step_times_s),
                          steady_state_start=result.steady_state_start,
                          metrics={"peak_mem_mib": result.peak_mem_mib})
"""
BENCH = """
from allreduce_kind import AllReduce
from perfsuite import parametrize

@parametrize([AllReduce("collectives", "allreduce_16mib", world_size=2, warmup_steps=2, steps=20)])
def test_bench(perf, scenario):
    perf.check(scenario)
"""


def test_a_registered_metric_of_a_new_kind_is_recorded_and_gated(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(allreduce_kind=KIND, allreduce_rank=RUNNER, test_bench=BENCH)
    pytester.mkdir("baselines")
    run = ("-p", "no:cacheprovider", "-rA", "--perf-profile=cpu")
    pytester.runpytest_subprocess(*run, "--perf-update-baselines").assert_outcomes(passed=1)
    path = pytester.path / "baselines" / "cpu" / "collectives.json"
    entry = json.loads(path.read_text())["scenarios"]["collectives.allreduce_16mib"]
    stored = entry["metrics"]["allreduce_busbw_gbps"]
    assert set(stored) == {"mean", "std", "n"} and stored["n"] == 20 and stored["mean"] > 0

    out = pytester.path / "r.json"
    again = pytester.runpytest_subprocess(*run, f"--perf-json={out}")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["collectives.allreduce_16mib*ok*GB/s*"])
    (result,) = json.loads(out.read_text())["results"]
    # Gated, and green: this VM's drift can take the rerun past the upper tolerance ("improved").
    assert result["verdict"] in ("pass", "improved"), result["message"]
    assert result["config"]["kind"] == "allreduce"
    assert [c["metric"] for c in result["checks"]] == ["allreduce_busbw_gbps", "peak_mem_mib"]

    doc = json.loads(path.read_text())
    doc["scenarios"]["collectives.allreduce_16mib"]["metrics"]["allreduce_busbw_gbps"]["mean"] *= 10
    path.write_text(json.dumps(doc))
    doctored = pytester.runpytest_subprocess(*run, "--perf-confirm=0")
    doctored.assert_outcomes(failed=1)
    doctored.stdout.fnmatch_lines(
        ["*collectives.allreduce_16mib: regression: allreduce_busbw_gbps*vs baseline*higher is better*"]
    )


def test_user_extra_metrics_run_beside_the_default_mfu(pytester: pytest.Pytester) -> None:
    """MFU is perfsuite's own implementation of the extra-metrics hook, so a
    user's implementation no longer replaces it (or is skipped because of it)."""
    from perfsuite.core.profiles import gpu_profile
    from perfsuite.gate.session import ScenarioResult
    from perfsuite.judge.ceilings import Ceilings
    from perfsuite.judge.compare import Judgement
    from perfsuite.judge.stats import ScenarioMetrics, Summary

    pytester.makeconftest(
        textwrap.dedent("""
        def pytest_perfsuite_extra_metrics(result):
            return {"mine": result.scenario.id}
    """)
    )
    config = pytester.parseconfigure()
    scenario = Scenario("g", "n", TINY, precision="fp16", world_size=2, micro_batch=1, global_batch=2, seq_len=16)
    metrics = ScenarioMetrics({"samples_per_s": Summary(2.0, 0.1, 5)}, 1.0, 1.0, [1.0] * 5)
    result = ScenarioResult(scenario, "ok", Judgement("pass", ""), metrics)
    found = config.hook.pytest_perfsuite_extra_metrics(
        result=result,
        fingerprint={"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]},
        profile=gpu_profile("nvidia-h100-80gb-hbm3-x1"),
        ceilings=Ceilings(),
    )
    merged = {k: v for extra in found if extra for k, v in extra.items()}
    assert merged["mine"] == "g.n"
    assert merged["mfu"]["peak_tflops"] == 989.0 and "6*B*s*l*h*(4h + 2f + 2s)" in merged["mfu"]["formula"]
