"""Reporting: the end-of-run summary table and the results file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfsuite.baselines import atomic_write_json
from perfsuite.relations import RelationOutcome
from perfsuite.session import ScenarioResult

COLUMNS = ("scenario", "status", "samples/s", "delta", "peak MiB", "state MiB/rank", "verdict")


def _row(result: ScenarioResult) -> tuple[str, ...]:
    m = result.metrics
    throughput = f"{m.samples_per_s.mean:.2f} +/- {m.samples_per_s.std:.2f}" if m else "-"
    delta = "-"
    for check in result.judgement.checks:
        if check.metric == "samples_per_s":
            delta = f"{check.delta:+.1%}"
    return (
        result.scenario.id,
        result.status,
        throughput,
        delta,
        f"{m.peak_mem_mib:.0f}" if m else "-",
        f"{m.model_state_bytes_per_rank / 2**20:.1f}" if m else "-",
        result.verdict,
    )


def table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def summary_lines(results: Iterable[ScenarioResult]) -> list[str]:
    return table(COLUMNS, (_row(r) for r in results))


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


def write_results(path: Path, document: dict[str, Any]) -> None:
    atomic_write_json(path, document)
