"""The bootstrap's report: one results file merged from its steps, the summary
table, the HTML page, and ``bootstrap.md``, which says what was recorded, how
long each step took, what the hardware delivers against its datasheet, how
noisy each scenario is, what the gate caught, and what is still missing."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfsuite.commands.bootstrap.plan import Plan
from perfsuite.commands.bootstrap.state import State
from perfsuite.commands.bootstrap.steps import safe
from perfsuite.core.files import atomic_write_json, atomic_write_text
from perfsuite.reports.html import results as res
from perfsuite.reports.html import summary
from perfsuite.store.baselines import BaselineError, BaselineStore


def merged_results(state: State, out: Path) -> dict[str, Any]:
    """Every step's results file as one document: the latest result per scenario, the best ceiling per dtype."""
    doc: dict[str, Any] = {"machine": {}, "profile": state.profile, "results": [], "relations": [], "ceilings": {}}
    by_id: dict[str, Any] = {}
    for key in sorted(state.steps, key=lambda k: state.steps[k].finished_at):  # the latest run of a scenario wins
        path = out / "results" / f"{safe(key)}.json"
        if not path.exists():
            continue
        step_doc = json.loads(path.read_text())
        doc["machine"] = doc["machine"] or step_doc.get("machine", {})
        for result in step_doc.get("results", []):
            by_id[result["id"]] = result
        for dtype, ceiling in (step_doc.get("ceilings") or {}).items():
            if dtype not in doc["ceilings"] or ceiling["tflops"] > doc["ceilings"][dtype]["tflops"]:
                doc["ceilings"][dtype] = ceiling
    doc["results"] = list(by_id.values())
    return doc


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def ceiling_rows(document: Mapping[str, Any], plan: Plan) -> list[tuple[str, ...]]:
    ceilings = {t.id for t in plan.targets if t.ceiling}
    rows: list[tuple[str, ...]] = []
    for result in document["results"]:
        if result["id"] not in ceilings or result["status"] != "ok":
            continue
        metric = res.primary_metric(result) or ""
        peak = ((result.get("metrics") or {}).get("extra") or {}).get("peak") or {}
        share = res.number(peak.get("value"))
        of = f"{share:.0%} of {peak.get('peak')} {peak.get('unit', '')}" if share is not None else peak.get("note", "-")
        mean, std = res.value(result["metrics"], metric), res.spread(result["metrics"], metric)
        rows.append((result["id"], f"{_fmt(mean, 4)} ± {_fmt(std, 2)} {res.unit(metric)}", str(of)))
    return rows


def baseline_rows(store: BaselineStore, plan: Plan) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for target in plan.targets:
        try:
            entry = store.get(target.group, target.id)
        except BaselineError as exc:
            rows.append((target.id, "-", "-", "-", "-", "-", str(exc)[:80]))
            continue
        if entry is None:
            continue
        calibration = entry.extra.get("calibration") or {}
        metric = target.primary
        cv = res.number(calibration.get(f"cv_{metric}"))
        tolerance = entry.tolerances.get(metric)
        rows.append(
            (
                target.id,
                f"{target.world_size}",
                target.shape,
                f"{_fmt(entry.value(metric), 4)} {res.unit(metric)}",
                _fmt(entry.value("peak_mem_mib"), 5),
                f"{cv:.2%} over {calibration['repeats']}" if cv is not None else "not calibrated",
                f"{tolerance:.0%}" if tolerance is not None else "-",
            )
        )
    return rows


def detection_rows(detection: Mapping[str, Any]) -> list[tuple[str, ...]]:
    from scipy.stats import binomtest

    rows: list[tuple[str, ...]] = []
    for row in detection.get("levels", []):
        n, k = int(row["trials"]), int(row["failed"])
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact") if n else None
        interval = f"{ci.low:.0%}-{ci.high:.0%}" if ci else "-"
        measured = row.get("measured_changes") or []
        seen = f"{statistics.median(measured):+.1%}" if measured else "-"
        spreads = ", ".join(f"{cv:.1%}" for cv in row.get("step_cvs") or []) or "-"
        rows.append(
            (
                f"{row['level']:g}%",
                f"{row['throughput_change']:.1%}",
                seen,
                f"{k}/{n}",
                interval,
                str(row.get("unreliable", 0)),
                spreads,
            )
        )
    return rows


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    cells = [[str(c).replace("|", "/").replace("\n", " ") for c in row] for row in rows]
    return [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}", *(f"| {' | '.join(r)} |" for r in cells)]


def markdown(state: State, plan: Plan, document: Mapping[str, Any], store: BaselineStore, verdict: str) -> str:
    facts = state.facts
    doctor = facts.get("doctor", {})
    lines = [f"# perfsuite bootstrap: {state.profile}", "", *[f"- {line}" for line in doctor.get("machine", [])]]
    lines += [f"- budget: {facts.get('budget_s', 0):.0f} s, used {facts.get('used_s', 0):.0f} s", ""]
    lines += ["## Steps", ""]
    step_rows = []
    for step in (s for s in plan.steps if s.kind != "report"):
        record = state.steps.get(step.key)
        status = record.status if record else "missing"
        wall = f"{record.wall_s:.1f}" if record else "-"
        message = (record.message if record else "not started: the budget ran out")[:200]
        step_rows.append((step.key, status, wall, f"{step.estimate_s:.0f}", message))
    lines += [*table(("step", "status", "wall s", "estimate s", "note"), step_rows), ""]
    lines += [
        "## Ceilings (same session)",
        "",
        *table(("scenario", "measured", "of datasheet"), ceiling_rows(document, plan)),
        "",
    ]
    lines += ["## Baselines and their spread between launches", ""]
    lines += [
        *table(("scenario", "ranks", "shape", "primary", "peak MiB", "CV", "tolerance"), baseline_rows(store, plan)),
        "",
    ]
    if facts.get("detection"):
        detection = facts["detection"]
        lines += [f"## Detection ({detection.get('keyword')}, against its recorded baseline)", ""]
        header = (
            "planted",
            "nominal change",
            "measured (median)",
            "gate failed",
            "95% interval",
            "unreliable",
            "step CV per trial",
        )
        lines += [*table(header, detection_rows(detection)), ""]
    if plan.not_here:
        lines += ["## Not recordable on this machine", "", *table(("scenario", "why"), list(plan.not_here.items())), ""]
    lines += [f"**{verdict}**", ""]
    return "\n".join(lines)


def write(state: State, plan: Plan, out: Path, store: BaselineStore, verdict: str) -> list[Path]:
    """Write results.json, summary.md, report.html (where matplotlib is) and bootstrap.md; return their paths."""
    document = merged_results(state, out)
    written = [out / "results.json", out / "summary.md", out / "bootstrap.md"]
    atomic_write_json(written[0], document)
    atomic_write_text(written[1], summary.markdown(document))
    atomic_write_text(written[2], markdown(state, plan, document, store, verdict))
    try:
        from perfsuite.reports.html import page
    except ImportError as exc:  # the report extra is missing: say so, keep the rest
        state.facts["html_report"] = f"not written: {exc}"
        return written
    page.write(out / "report.html", page.render(document, str(written[0]), None))
    return [*written, out / "report.html"]
