"""What a run cost and how close it came to the hardware, as report tables.

* Cost and time: per group with two or more measured configurations, the
  results file's ``ranking`` (perfsuite.reports.cost) fastest first, with each one's
  price per million samples and tokens, energy per sample and, for a job the
  user stated (``--perf-job``), its estimated hours and cost.
* Hardware: the session's ceilings (best matmul TFLOP/s per dtype,
  perfsuite.judge.ceilings) and each training scenario's achieved TFLOP/s per rank
  against its ceiling and, on a GPU, against the datasheet peak (MFU).

Both read only the results file's JSON, as the rest of the report does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.reports.html import results as res

COST_COLUMNS = ("scenario", "samples/s", "ranks", "per 1M samples", "per 1M tokens", "J/sample")
JOB_COLUMNS = ("job hours", "job cost")
CEILING_COLUMNS = ("dtype", "best TFLOP/s", "measured by")
ACHIEVED_COLUMNS = ("scenario", "precision", "TFLOP/s per rank", "of ceiling", "MFU", "peak")


@dataclass(frozen=True)
class GroupCosts:
    """One group's configurations, fastest first, and its order by cost."""

    group: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    cheapest_first: str
    """Scenario ids cheapest first, joined by `` < ``; empty without a price."""


def cost_groups(document: Mapping[str, Any]) -> list[GroupCosts]:
    """Every ranked group of ``document``, in the order the file lists them."""
    by_id = {r["id"]: r for r in document["results"]}
    groups = []
    for group, order in (document.get("ranking") or {}).items():
        if not isinstance(order, Mapping) or not order.get("by_time"):
            continue
        with_job = any("hours" in entry for entry in order["by_time"])
        by_cost = order.get("by_cost") or []
        # A job's cost is in the by-cost list only (priced entries), its hours in both.
        jobs = {str(e["id"]): e.get("job") or {} for e in by_cost}
        rows = [
            _cost_row(entry, by_id.get(entry["id"]), jobs.get(entry["id"], {}) if with_job else None)
            for entry in order["by_time"]
        ]
        cheapest = " < ".join(str(e["id"]) for e in by_cost)
        groups.append(GroupCosts(group, COST_COLUMNS + (JOB_COLUMNS if with_job else ()), rows, cheapest))
    return groups


def _cost_row(entry: Mapping[str, Any], result: res.Result | None, job: Mapping[str, Any] | None) -> tuple[str, ...]:
    cost = _extra(result, "cost")
    currency = f" {cost['currency']}" if cost.get("currency") else ""
    cells = [
        str(entry["id"]),
        _number(entry.get("samples_per_s")),
        str(((result or {}).get("config") or {}).get("world_size", "-")),  # one GPU per rank on a GPU
        _number(cost.get("per_million_samples"), currency),
        _number(cost.get("per_million_tokens"), currency),
        _number(cost.get("energy_j_per_sample")),
    ]
    if job is not None:
        cells += [_number(entry.get("hours")), _number(job.get("cost"), currency)]
    return tuple(cells)


def ceilings(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The session's best matmul per dtype: dtype, TFLOP/s, the scenario that measured it."""
    found = document.get("ceilings") or {}
    return [(str(dtype), _number(c.get("tflops")), str(c.get("scenario", "-"))) for dtype, c in sorted(found.items())]


def achieved(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Training scenarios that have a ceiling fraction or an MFU: what they achieved against each."""
    rows: list[tuple[str, ...]] = []
    for result in document["results"]:
        ceiling, mfu = _extra(result, "ceiling"), _extra(result, "mfu")
        if not ceiling and not mfu:
            continue
        tflops = ceiling.get("achieved_tflops_per_rank", mfu.get("achieved_tflops_per_gpu"))
        precision = str((result.get("config") or {}).get("precision", "-"))
        peak = str(mfu.get("peak_source") or mfu.get("note") or "-")
        rows.append(
            (result["id"], precision, _number(tflops), _percent(ceiling.get("value")), _percent(mfu.get("value")), peak)
        )
    return rows


def formulas(document: Mapping[str, Any]) -> list[str]:
    """The FLOP formulas the achieved figures used, each once."""
    seen: dict[str, None] = {}
    for result in document["results"]:
        for key in ("ceiling", "mfu"):
            formula = _extra(result, key).get("formula")
            if isinstance(formula, str):
                seen[formula] = None
    return list(seen)


def _extra(result: res.Result | None, key: str) -> Mapping[str, Any]:
    extra = ((result or {}).get("metrics") or {}).get("extra") or {}
    found = extra.get(key) if isinstance(extra, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _number(node: Any, suffix: str = "") -> str:
    found = res.number(node)
    return "-" if found is None else f"{found:.4g}{suffix}"


def _percent(node: Any) -> str:
    found = res.number(node)
    return "-" if found is None else f"{found:.1%}"
