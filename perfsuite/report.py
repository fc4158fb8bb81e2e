"""Reporting: the end-of-run summary table and the results file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfsuite import metrics as registry
from perfsuite.files import atomic_write_json
from perfsuite.relations import RelationOutcome
from perfsuite.session import ScenarioResult
from perfsuite.workloads.base import ran_otherwise

COLUMNS = ("scenario", "status", "throughput", "delta", "peak MiB", "state MiB/rank", "verdict")


def _row(result: ScenarioResult) -> tuple[str, ...]:
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
    return (
        result.scenario.id,
        result.status,
        throughput,
        delta,
        _cell(m, "peak_mem_mib", 1),
        _cell(m, "model_state_bytes_per_rank", 2**20),
        result.verdict,
    )


def _cell(metrics: Any, name: str, scale: float) -> str:
    if metrics is None or name not in metrics.values:
        return "-"
    value = metrics.value(name) / scale
    return f"{value:.0f}" if scale == 1 else f"{value:.1f}"


def table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def summary_lines(results: Iterable[ScenarioResult]) -> list[str]:
    """The table, then a note per row whose variant changed its declared precision."""
    results = list(results)
    notes = [(r.scenario.id, ran_otherwise(r.scenario.to_config())) for r in results]
    return table(COLUMNS, (_row(r) for r in results)) + [f"note: {name}: {note}" for name, note in notes if note]


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
