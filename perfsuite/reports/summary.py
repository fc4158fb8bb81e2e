"""Reporting: the end-of-run summary table and the results file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core.files import atomic_write_json
from perfsuite.core.relations import RelationOutcome
from perfsuite.core.text import table
from perfsuite.core.workloads.base import ran_otherwise
from perfsuite.judge.results import ScenarioResult

#: The columns every summary has; the registry's gated metrics go between "delta" and "verdict".
COLUMNS = ("scenario", "status", "throughput", "delta", "verdict")


def metric_columns(results: Iterable[ScenarioResult]) -> list[registry.Metric]:
    """The gated metrics the results measured beside their headline figure (:func:`perfsuite.core.metrics.columns`)."""
    return registry.columns((r.scenario.primary, r.metrics.values if r.metrics else ()) for r in results)


def _row(result: ScenarioResult, extra: list[registry.Metric]) -> tuple[str, ...]:
    m, primary = result.metrics, result.scenario.primary
    throughput = delta = "-"
    if m is not None and primary in m.values:
        summary = m.summary(primary)
        # Significant digits, not decimals: TFLOP/s of a cpu microbenchmark are 0.00x.
        spread = f" +/- {summary.std:.2g}" if summary else ""
        throughput = f"{m.value(primary):.4g}{spread} {registry.get(primary).unit}"
    for check in result.judgement.checks:
        if check.metric == primary:
            delta = f"{check.delta:+.1%}"
    cells = [
        metric.show(m.value(metric.name)) if m and metric.name in m.values and metric.name != primary else "-"
        for metric in extra
    ]
    return (result.scenario.id, result.status, throughput, delta, *cells, result.verdict)


def summary_lines(results: Iterable[ScenarioResult]) -> list[str]:
    """The table, then a note per row whose variant changed its declared precision."""
    results = list(results)
    extra = metric_columns(results)
    header = (*COLUMNS[:-1], *(metric.header for metric in extra), COLUMNS[-1])
    notes = [(r.scenario.id, ran_otherwise(r.scenario.to_config())) for r in results]
    return table(header, (_row(r, extra) for r in results)) + [f"note: {name}: {note}" for name, note in notes if note]


def relation_lines(outcomes: Iterable[RelationOutcome]) -> list[str]:
    return table(("relation", "status", "detail"), ((o.relation.id, o.status, _clip(o.message)) for o in outcomes))


def _clip(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def results_document(
    fingerprint: dict[str, Any], profile: str, results: Iterable[ScenarioResult], **extra: Any
) -> dict[str, Any]:
    return {
        "machine": fingerprint,
        "profile": profile,
        "results": [r.to_json() for r in results],
        **extra,
    }


class ResultsWriteError(Exception):
    """The results file could not be written; the message names it and the cause."""


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Write the results file atomically: a failed write leaves any old file whole."""
    try:
        atomic_write_json(path, document)
    except OSError as exc:
        raise ResultsWriteError(
            f"perfsuite: cannot write the results file {path} ({exc.strerror or exc}); "
            "any earlier file there is unchanged. Free space or choose another --perf-json path."
        ) from None
