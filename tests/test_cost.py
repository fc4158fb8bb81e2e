"""Cost per sample, a stated job's time and cost, energy per sample and the ranking."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import CPU_PROFILE, TINY

from perfsuite.reports.cost import Job, cost_of, estimate, ranking

V100 = {"world_size": 4, "global_batch": 128, "steps": 10}


def test_cost_per_million_samples_and_tokens_from_the_price_per_gpu_hour() -> None:
    # The seed's V100_4gpu_8 row: 20.108 samples/s on 4 cards at 5.3 CNY per card-hour.
    cost = cost_of(V100, {"samples_per_s": 20.108, "tokens_per_s": 20.108 * 128}, [], 5.3, "CNY")
    assert cost is not None and cost["currency"] == "CNY" and cost["gpus"] == 4
    assert cost["per_million_samples"] == pytest.approx(4 * 5.3 / 3600 / 20.108 * 1e6)
    assert cost["per_million_tokens"] == pytest.approx(cost["per_million_samples"] / 128)
    job = estimate(cost, 20.108, Job(2048, 2))
    assert job["hours"] == pytest.approx(4096 / 20.108 / 3600) and job["cost"] == pytest.approx(job["hours"] * 4 * 5.3)


def test_energy_per_sample_from_every_ranks_counter_and_nothing_without_a_rate() -> None:
    health = [{"rank": r, "energy_j": 1000.0} for r in range(4)] + [{"rank": 9}]
    cost = cost_of(V100, {"samples_per_s": 10.0}, health, None, "USD")
    assert cost is not None and "per_million_samples" not in cost  # no price, no money
    assert cost["energy_j_per_sample"] == pytest.approx(4000 / (128 * 10))
    assert cost_of(V100, {"tflops": 3.0}, [], 5.3, "CNY") is None
    assert cost_of(V100, {"samples_per_s": 10.0}, [], None, "USD") is None  # nothing to say


@dataclass
class Fake:
    id: str
    samples_per_s: float
    extra_metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def scenario(self) -> Any:
        group, name = self.id.split(".")
        return type("S", (), {"id": self.id, "group": group, "name": name, "world_size": 1})()

    @property
    def metrics(self) -> Any:
        values = {"samples_per_s": self.samples_per_s}
        return type("M", (), {"values": values, "value": lambda _, name: values[name]})()


def test_a_group_is_ranked_by_cost_and_by_time() -> None:
    # The seed's anomaly in money: 4 V100s are faster than one, but cost more per sample.
    one = Fake("c2.gpu1_bs8_fp16", 23.419)
    four = Fake("c2.gpu4_bs8_fp16", 19.941 * 1.2)
    for result, gpus in ((one, 1), (four, 4)):
        result.extra_metrics["cost"] = cost_of(
            {"world_size": gpus}, {"samples_per_s": result.samples_per_s}, [], 5.3, "CNY"
        )
    ranked = ranking([four, one], Job(2048, 2))["c2"]
    assert [e["id"] for e in ranked["by_cost"]] == ["c2.gpu1_bs8_fp16", "c2.gpu4_bs8_fp16"]
    assert [e["id"] for e in ranked["by_time"]] == ["c2.gpu4_bs8_fp16", "c2.gpu1_bs8_fp16"]
    assert ranked["by_cost"][0]["job"]["cost"] == pytest.approx(4096 / 23.419 / 3600 * 5.3)
    unpriced = ranking([four, Fake("c2.gpu2_bs8_fp16", 30.0)], None)["c2"]
    assert [e["id"] for e in unpriced["by_cost"]] == ["c2.gpu4_bs8_fp16"]  # only the priced one
    assert [e["id"] for e in unpriced["by_time"]] == ["c2.gpu2_bs8_fp16", "c2.gpu4_bs8_fp16"]


MODULE = textwrap.dedent(
    f"""
    from perfsuite import Microbench, ModelSpec, Scenario, parametrize

    TINY = {TINY}
    SHAPE = dict(micro_batch=4, seq_len=32, warmup_steps=1, steps=3)
    SCENARIOS = [
        Scenario("g", "one", TINY, world_size=1, global_batch=4, **SHAPE),
        Scenario("g", "two", TINY, world_size=2, global_batch=8, **SHAPE),
        # Declared last, run first: ceilings are measured before training scenarios.
        Microbench("mb", "fp32", op="matmul", dtype="fp32", shape=(256, 256, 256), warmup_steps=1, steps=3),
    ]

    @parametrize(SCENARIOS)
    def test_bench(perf, scenario):
        perf.check(scenario)
    """
)


def test_price_from_the_ini_ranks_the_group_and_training_is_set_against_the_ceiling(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=MODULE)
    project.makeini("[pytest]\nperf_gpu_hour_price = 9.3\nperf_currency = CNY\n")
    out = project.path / "r.json"
    result = project.runpytest_subprocess(
        CPU_PROFILE, "--perf-job=2048x2", f"--perf-json={out}", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(skipped=3)
    result.stdout.re_match_lines([r".*mb\.fp32.*", r".*g\.one.*", r".*g\.two.*"])  # the ceiling ran first
    result.stdout.fnmatch_lines(
        [
            "*perfsuite cost and time ranking (9.3 CNY per GPU-hour)*",
            "g by cost (a job of 2048 samples x 2 epochs): *<*",
        ]
    )
    doc = json.loads(out.read_text())
    by_id = {r["id"]: r for r in doc["results"]}
    cost = by_id["g.two"]["metrics"]["extra"]["cost"]
    sps = by_id["g.two"]["metrics"]["samples_per_s"]["mean"]
    assert cost["per_million_samples"] == pytest.approx(2 * 9.3 / 3600 / sps * 1e6)
    order = doc["ranking"]["g"]
    assert {e["id"] for e in order["by_cost"]} == {"g.one", "g.two"}
    costs = [e["cost"] for e in order["by_cost"]]
    assert costs == sorted(costs) and order["by_cost"][0]["job"]["epochs"] == 2

    # Same-session ceiling: each training run against the best fp32 matmul measured before it.
    ceiling = doc["ceilings"]["fp32"]
    assert ceiling["scenario"] == "mb.fp32" and ceiling["tflops"] == by_id["mb.fp32"]["metrics"]["tflops"]["mean"]
    fraction = by_id["g.two"]["metrics"]["extra"]["ceiling"]
    assert fraction["ceiling_tflops"] == ceiling["tflops"] and fraction["value"] > 0
    assert fraction["value"] == pytest.approx(fraction["achieved_tflops_per_rank"] / ceiling["tflops"])


def test_a_malformed_job_or_price_is_a_usage_error(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=MODULE)
    result = project.runpytest_subprocess(CPU_PROFILE, "--perf-job=lots")
    result.stderr.fnmatch_lines(["*--perf-job must be SAMPLES or SAMPLESxEPOCHS*'lots'*"])
    project.makeini("[pytest]\nperf_gpu_hour_price = cheap\n")
    result = project.runpytest_subprocess(CPU_PROFILE, "--collect-only")
    result.stderr.fnmatch_lines(["*perf_gpu_hour_price must be a number*'cheap'*"])
