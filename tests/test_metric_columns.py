"""A metric is defined once, in the registry: a newly registered gated metric
shows up in the terminal summary, the markdown job summary, the HTML page, the
max-batch table and the A/B's compared metrics without editing any of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from perfsuite import ModelSpec
from perfsuite.core import metrics as registry
from perfsuite.core.metrics import Metric
from perfsuite.core.profiles import CPU, gpu_profile
from perfsuite.core.workloads.train import Scenario
from perfsuite.gate.session import ScenarioResult
from perfsuite.judge.compare import Judgement
from perfsuite.judge.stats import ScenarioMetrics, Summary
from perfsuite.plugin.modes.ab import gated
from perfsuite.plugin.modes.batchsearch import MaxBatchResult, Trial
from perfsuite.reports.summary import results_document, summary_lines

WIDGETS = Metric(
    "widgets_per_step", "widgets", "lower", noisy=True, tolerances={"cpu": 0.2, "cuda": 0.03}, label="widgets/step"
)
UNGATED = Metric("gadgets_per_step", "gadgets", "lower", noisy=True, label="gadgets/step")
TINY = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)
SCENARIO = Scenario("g", "n", TINY, world_size=2, micro_batch=2, global_batch=4, seq_len=16)


@pytest.fixture
def widgets() -> Iterator[Metric]:
    with registry.METRICS.registered(WIDGETS), registry.METRICS.registered(UNGATED):
        yield WIDGETS
    assert WIDGETS.name not in registry.METRICS  # gone again: other tests see the shipped registry


def measured(**extra: float) -> ScenarioResult:
    values: dict[str, Any] = {"samples_per_s": Summary(80.0, 4.0, 8), "peak_mem_mib": 512.0, **extra}
    metrics = ScenarioMetrics(values, 0.1, 0.1, [0.1] * 8)
    return ScenarioResult(SCENARIO, "ok", Judgement("pass", ""), metrics)


def document(**extra: float) -> dict[str, Any]:
    return json.loads(json.dumps(results_document({"host": "vm"}, "cpu", [measured(**extra)])))


def test_a_new_gated_metric_is_a_column_of_the_terminal_summary(widgets: Metric) -> None:
    header, _, row = summary_lines([measured(widgets_per_step=1234.4, gadgets_per_step=7.0)])
    assert header.split()[-3:] == ["MiB", "widgets/step", "verdict"] and "gadgets" not in header
    assert row.split()[-2:] == ["1234", "pass"]
    # Not measured by this run: no column.
    assert "widgets" not in summary_lines([measured()])[0]


def test_a_new_gated_metric_is_a_column_of_the_markdown_and_html_summaries(widgets: Metric) -> None:
    from perfsuite.reports.html import summary

    doc = document(widgets_per_step=3.25)
    assert "widgets/step" in summary.columns(doc) and "gadgets/step" not in summary.columns(doc)
    (row,) = [line for line in summary.markdown(doc).splitlines() if line.startswith("| `g.n`")]
    assert "| 512 | 3.25 |" in row
    pytest.importorskip("jinja2", reason="the report extra: pip install 'perfsuite[report]'")
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    from perfsuite.reports.html.page import render

    page = render(doc, "results.json")
    assert "<th>widgets/step</th>" in page and '<td class="num">3.25</td>' in page


def test_a_new_gated_metric_is_a_column_of_the_max_batch_table(widgets: Metric) -> None:
    trial = Trial(2, 4, "ok", Summary(80.0, 4.0, 8), {"peak_mem_mib": 512.0, "widgets_per_step": 9.5})
    result = MaxBatchResult(SCENARIO, 2, 8, (trial, Trial(4, 8, "oom")))
    header, row = result.lines()[1].split(), result.lines()[3].split()
    assert header[-1] == "widgets/step" and row[-1] == "9.5"
    assert result.to_json()["trials"][0]["widgets_per_step"] == 9.5


def test_a_new_gated_metric_is_compared_by_the_ab(widgets: Metric) -> None:
    names = ("samples_per_s", "peak_mem_mib", "widgets_per_step", "gadgets_per_step")
    # The headline's tolerance is the gate's; the sequential A/B judges it against the minimum effect.
    assert gated("samples_per_s", names, {}, CPU) == {
        "samples_per_s": 0.4,
        "peak_mem_mib": 0.15,
        "widgets_per_step": 0.2,
    }
    gpu = gpu_profile("nvidia-h100-80gb-hbm3-x1")
    assert gated("samples_per_s", names, {"gadgets_per_step": 0.1}, gpu)["widgets_per_step"] == 0.03
    # A scenario's own tolerance gates an otherwise ungated metric, as in the gate.
    assert gated("samples_per_s", names, {"gadgets_per_step": 0.1}, gpu)["gadgets_per_step"] == 0.1
