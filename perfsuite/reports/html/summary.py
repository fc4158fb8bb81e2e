"""The summary table of a results file: rows for a terminal, or markdown for a
CI job summary (``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core import processor as processors
from perfsuite.core.opprofile import TABLE_COLUMNS
from perfsuite.core.workloads.base import ran_otherwise
from perfsuite.judge.explain import Explanation
from perfsuite.launch.identity import describe_card
from perfsuite.reports.html import results as res

#: The columns every summary has; the registry's gated metrics go between "tolerance" and "detail".
BASE_COLUMNS = ("scenario", "verdict", "throughput", "delta", "tolerance", "detail")
#: Marks that let a verdict be read at a glance in a job summary.
MARKS = {"good": "✅", "bad": "❌", "warn": "⚠️", "muted": "⏭️"}


def throughput(result: res.Result) -> str:
    """The primary metric as ``mean +/- std unit``."""
    name = res.primary_metric(result)
    mean = res.value(result.get("metrics"), name) if name else None
    if name is None or mean is None:
        return "-"
    std = res.spread(result.get("metrics"), name)
    spread = f" +/- {std:.2g}" if std is not None else ""
    return f"{mean:.4g}{spread} {res.unit(name)}".rstrip()


def delta(result: res.Result) -> tuple[str, str]:
    """The primary metric's change from the baseline, and the tolerance it was judged with."""
    found = res.check(result, res.primary_metric(result))
    if found is None:
        return "-", "-"
    return f"{found['delta']:+.1%}", f"{found['tolerance']:.0%}"


def peak_mib(result: res.Result) -> str:
    peak = res.value(result.get("metrics"), "peak_mem_mib")
    return "-" if peak is None else f"{peak:.0f}"


def metric_columns(document: Mapping[str, Any]) -> list[registry.Metric]:
    """The gated metrics the file's results measured beside their headline figure."""
    measured = ((res.primary_metric(r), (r.get("metrics") or {}).keys()) for r in document["results"])
    return registry.columns(measured)


def columns(document: Mapping[str, Any]) -> tuple[str, ...]:
    """The table's header: the base columns with a column per gated metric the file holds."""
    return (*BASE_COLUMNS[:-1], *(metric.header for metric in metric_columns(document)), BASE_COLUMNS[-1])


def _metric_cells(result: res.Result, extra: list[registry.Metric]) -> list[str]:
    primary, measured = res.primary_metric(result), result.get("metrics")
    found = [(metric, res.value(measured, metric.name)) for metric in extra]
    return ["-" if value is None or metric.name == primary else metric.show(value) for metric, value in found]


def row(result: res.Result, extra: list[registry.Metric]) -> tuple[str, ...]:
    """One result's cells under :func:`columns` (``extra``: :func:`metric_columns` of its file)."""
    change, tolerance = delta(result)
    # The first line: a crash's message goes on with the rank's stderr.
    detail = "" if result["verdict"] == "pass" else (str(result.get("message") or "").splitlines() or [""])[0]
    note = ran_otherwise(result.get("config") or {})  # e.g. an fp16 row that ran bf16 on cpu
    detail = f"{detail} ({note})" if detail and note else detail or note or ""
    cells = _metric_cells(result, extra)
    return (result["id"], result["verdict"], throughput(result), change, tolerance, *cells, detail)


def rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    extra = metric_columns(document)
    return [row(r, extra) for r in document["results"]]


def _cell(text: str, width: int = 160) -> str:
    text = text if len(text) <= width else text[: width - 3] + "..."
    # A pipe would end the cell and a newline the row.
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in cells) + " |" for cells in body]


@dataclass(frozen=True)
class Why:
    """A result's op-profile diff as the reports show it (:mod:`perfsuite.judge.explain`)."""

    id: str
    lead: str
    rows: list[tuple[str, ...]]
    trace: str


def explanations(document: Mapping[str, Any]) -> list[Why]:
    """Every result that carries an op profile: its lead line and diff table, regressions first."""
    found = []
    for result in document["results"]:
        if result.get("op_profile"):
            explained = Explanation.from_json(result["op_profile"])
            table = explained.diff()
            rows = table.table() if table is not None else []
            found.append(
                (result["verdict"] != "regression", Why(result["id"], explained.lead(), rows, explained.trace))
            )
    return [why for _, why in sorted(found, key=lambda pair: pair[0])]


def markdown(document: Mapping[str, Any]) -> str:
    """The job-summary section: headline, one row per scenario, the relations."""
    body = []
    for cells in rows(document):
        body.append((f"`{cells[0]}`", f"{MARKS[res.style(cells[1])]} {cells[1]}", *cells[2:]))
    lines = [f"## perfsuite: {res.headline(document)}", ""]
    coverage = document.get("coverage")
    if coverage:  # the gate's own verdict on what it could judge, above the rows
        mark = MARKS["good"] if coverage.get("ok") else MARKS["bad"]
        notes = [*coverage.get("fixes", []), *coverage.get("notes", [])]
        alarms = (document.get("false_alarms") or {}).get("line")
        notes += [alarms] if alarms else []
        lines += [f"**{mark} {coverage.get('line', '')}**", *(f"- {note}" for note in notes), ""]
    lines += _table(columns(document), body)
    relations = document.get("relations") or []
    if relations:
        lines += ["", "### Relations", ""]
        lines += _table(
            ("relation", "status", "detail"),
            [(f"`{r.get('id', '?')}`", str(r.get("status", "?")), str(r.get("message", ""))) for r in relations],
        )
    for why in explanations(document):
        lines += ["", f"### Why `{why.id}` changed", "", why.lead, ""]
        lines += _table(TABLE_COLUMNS, [(f"`{r[0]}`", *r[1:]) for r in why.rows]) if why.rows else []
        lines += ["", f"Trace: `{why.trace}` (open it in https://ui.perfetto.dev)"] if why.trace else []
    machine = document.get("machine") or {}
    gpus = ", ".join(describe_card(g) if isinstance(g, Mapping) else str(g) for g in machine.get("gpus") or [])
    packages = ", ".join(f"{k} {v}" for k, v in (machine.get("packages") or {}).items())
    proc = machine.get("processor")
    cpu = processors.describe(proc) if isinstance(proc, Mapping) else machine.get("cpu", "cpu")
    lines += ["", f"Machine: {machine.get('host', '?')}, {gpus or cpu}; {packages}"]
    return "\n".join(lines) + "\n"


def text(document: Mapping[str, Any]) -> str:
    """The summary as an aligned plain-text table, for a terminal."""
    table = [columns(document), *rows(document)]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([res.headline(document), *lines]) + "\n"
