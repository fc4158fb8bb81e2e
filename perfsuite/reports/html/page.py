"""The HTML page: a jinja2 template filled with the summary, the charts and,
with a history folder, the trend charts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from perfsuite.core import processor as processors
from perfsuite.core.files import atomic_write_text
from perfsuite.core.opprofile import TABLE_COLUMNS
from perfsuite.judge.repro import Repro
from perfsuite.launch.identity import describe_card
from perfsuite.reports.html import efficiency, plots, summary
from perfsuite.reports.html import results as res

TEMPLATE = "page.html.j2"
#: Config fields shown under a scenario's heading, when the kind has them.
CONFIG_FIELDS = ("kind", "world_size", "nodes", "strategy", "precision", "micro_batch", "global_batch", "seq_len")


def render(document: Mapping[str, Any], source: str, history: Path | None = None) -> str:
    """The page for ``document`` (read from ``source``); trends from ``history`` when given."""
    template = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
        resources.files(__package__).joinpath(TEMPLATE).read_text()
    )
    return template.render(
        title=f"perfsuite report: {res.headline(document)}",
        source=source,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        headline=res.headline(document),
        coverage=document.get("coverage"),
        false_alarms=(document.get("false_alarms") or {}).get("line", ""),
        machine=_machine(document.get("machine") or {}),
        columns=summary.columns(document),
        rows=list(zip(summary.rows(document), (res.style(r["verdict"]) for r in document["results"]), strict=True)),
        overview=plots.overview(document),
        explanations=summary.explanations(document),
        op_columns=TABLE_COLUMNS,
        relations=document.get("relations") or [],
        costs=efficiency.cost_groups(document),
        ceilings=efficiency.ceilings(document),
        achieved=efficiency.achieved(document),
        formulas=efficiency.formulas(document),
        ceiling_columns=efficiency.CEILING_COLUMNS,
        achieved_columns=efficiency.ACHIEVED_COLUMNS,
        seed=[(r["id"], summary.throughput(r), summary.peak_mib(r), res.reference(r)) for r in document["results"]],
        scenarios=[_scenario(r) for r in document["results"]],
        trends=_trends(document, history) if history is not None else None,
        history=str(history) if history is not None else "",
        relation_style=res.relation_style,
    )


def write(path: Path, page: str) -> None:
    """Atomically: a CI step publishing the page never picks up half of it."""
    atomic_write_text(path, page)


def _machine(machine: Mapping[str, Any]) -> list[tuple[str, str]]:
    gpus = ", ".join(describe_card(g) for g in machine.get("gpus") or [] if isinstance(g, Mapping))
    packages = ", ".join(f"{k} {v}" for k, v in (machine.get("packages") or {}).items())
    proc = machine.get("processor")
    cpu = processors.describe(proc) if isinstance(proc, Mapping) else machine.get("cpu")
    facts = [
        ("host", machine.get("host")),
        ("cpu", cpu),
        ("cpus", machine.get("cpu_count")),
        ("gpus", gpus or "none"),
        ("python", machine.get("python")),
        ("packages", packages),
    ]
    return [(k, str(v)) for k, v in facts if v not in (None, "")]


def _scenario(result: res.Result) -> dict[str, Any]:
    config = result.get("config") or {}
    facts = ", ".join(f"{k} {config[k]}" for k in CONFIG_FIELDS if config.get(k) not in (None, ""))
    return {
        "id": result["id"],
        "verdict": result["verdict"],
        "style": res.style(result["verdict"]),
        "message": result.get("message") or "",
        "repro": repro_lines(result.get("repro")),
        "facts": facts,
        "reference": res.reference(result),
        "chart": plots.scenario(result),
    }


def _trends(document: Mapping[str, Any], directory: Path) -> list[dict[str, Any]]:
    """Each scenario's primary metric across the history, with change points.

    Imported here: only ``--history`` needs the history store."""
    from perfsuite.reports.exports import history

    runs = history.load(directory, document["profile"])
    charts = []
    for result in document["results"]:
        name = res.primary_metric(result)
        points = history.series(runs, result["id"], name) if name else []
        if name is None or len(points) < 2:
            continue
        changes = history.change_points(points)
        title = f"{result['id']}: {name} over {len(points)} runs"
        notes = [
            f"{c.rel_change:+.1%} at {(c.commit or '?')[:10]} ({c.before_mean:.4g} -> {c.after_mean:.4g}, "
            f"p={c.p_value:.3f}){c.label()}"
            for c in changes
        ]
        charts.append({"title": title, "chart": plots.trend(points, changes, title, res.unit(name)), "changes": notes})
    return charts


def repro_lines(found: Any) -> list[str]:
    """A failed result's commands (its ``repro``), each a line; none for an older file or a pass."""
    repro = Repro.of(found)
    return repro.lines() if repro is not None else []
