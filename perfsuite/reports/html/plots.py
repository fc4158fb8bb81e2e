"""The report's charts, drawn with matplotlib (Agg: no display) and returned as
PNG ``data:`` URIs so the page carries them inside itself."""

from __future__ import annotations

import base64
import io
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: CI runners and SSH sessions have no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from perfsuite.core import metrics as registry
from perfsuite.reports.html import results as res

if TYPE_CHECKING:
    from perfsuite.reports.exports.history import ChangePoint, Point

COLORS = {"good": "#2e7d32", "bad": "#c62828", "warn": "#ef6c00", "muted": "#9e9e9e"}
MEASURED, WARMUP, BASELINE = "#1565c0", "#9e9e9e", "#6a1b9a"


def data_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def overview(document: Mapping[str, Any]) -> str | None:
    """Each judged scenario's primary-metric change from its baseline, against its tolerance."""
    judged = []
    for result in document["results"]:
        found = res.check(result, res.primary_metric(result))
        if found is not None:
            judged.append((result["id"], float(found["delta"]), float(found["tolerance"]), result["verdict"]))
    if not judged:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(judged) + 1.2))
    for y, (_, change, tolerance, verdict) in enumerate(judged):
        ax.fill_betweenx([y - 0.4, y + 0.4], -tolerance * 100, tolerance * 100, color="#e0e0e0", zorder=0)
        ax.barh(y, change * 100, color=COLORS[res.style(verdict)], height=0.6, zorder=2)
    ax.set_yticks(range(len(judged)), [j[0] for j in judged])
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("primary metric vs baseline (%); grey: tolerance")
    ax.grid(axis="x", alpha=0.3)
    return data_uri(fig)


def scenario(result: res.Result) -> str | None:
    """Step times (warmup and measured) against the baseline's band, and per-rank bars."""
    metrics = result.get("metrics") or {}
    if not metrics.get("step_times_s"):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), gridspec_kw={"width_ratios": [3, 1, 1]})
    _step_times(axes[0], result)
    name = res.primary_metric(result)
    _per_rank(axes[1], metrics.get("per_rank") or [], name, MEASURED)
    _per_rank(axes[2], metrics.get("per_rank") or [], "peak_mem_mib", "#00838f")
    fig.tight_layout()
    return data_uri(fig)


def _step_times(ax: Axes, result: res.Result) -> None:
    metrics = result["metrics"]
    warmup = [float(t) for t in metrics.get("warmup_times_s") or []]
    measured = [float(t) for t in metrics["step_times_s"]]
    ax.plot(range(1, len(warmup) + 1), warmup, "o-", color=WARMUP, markersize=3, label="warmup")
    ax.plot(
        range(len(warmup) + 1, len(warmup) + len(measured) + 1),
        measured,
        "o-",
        color=MEASURED,
        markersize=3,
        label="measured",
    )
    band = baseline_band(result)
    if band is not None:
        at, low, high, limit = band
        ax.axhspan(low, high, color=BASELINE, alpha=0.15, label="baseline +/- 1 std")
        ax.axhline(at, color=BASELINE, linewidth=1, label="baseline")
        ax.axhline(limit, color=COLORS["bad"], linestyle="--", linewidth=1, label="gate limit")
    ax.set_xlabel("step (slowest rank)")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    # Above the axes: inside, it would hide steps.
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=5, frameon=False)


def baseline_band(result: res.Result) -> tuple[float, float, float, float] | None:
    """The baseline as step times: (time, fast edge, slow edge of +/- 1 std, gate limit).

    The baseline stores rates, one per step of ``work / step time``, so the work
    per step is this run's mean rate over its mean ``1 / step time``; the
    baseline's step time is that work over the baseline's rate, and the gate
    fails a run whose mean rate is below ``baseline * (1 - tolerance)``.
    """
    measured = result["metrics"]["step_times_s"]
    baseline = (result.get("baseline") or {}).get("metrics")
    name = res.primary_metric(result)
    found = res.check(result, name)
    # Only a rate of the steps (work per step over step time) turns into step times.
    if name is None or name not in registry.METRICS or found is None or registry.get(name).source != "steps":
        return None
    if found.get("direction") != "higher":
        return None
    current, base = res.value(result["metrics"], name), res.value(baseline, name)
    if current is None or not base or min(measured) <= 0:
        return None
    work = current / statistics.fmean(1 / t for t in measured)
    std = res.spread(baseline, name) or 0.0
    slow = work / (base - std) if base > std else work / base
    return work / base, work / (base + std), slow, work / (base * (1 - float(found["tolerance"])))


def _per_rank(ax: Axes, ranks: Sequence[Mapping[str, Any]], name: str | None, color: str) -> None:
    shown = [(r.get("rank", i), r[name]) for i, r in enumerate(ranks) if name and isinstance(r.get(name), (int, float))]
    ax.set_title(f"{name or 'throughput'} per rank" if shown else "no per-rank figures", fontsize=9)
    if not shown or name is None:
        ax.set_axis_off()
        return
    ax.bar([str(rank) for rank, _ in shown], [float(v) for _, v in shown], color=color)
    ax.set_xlabel("rank")
    ax.set_ylabel(res.unit(name))
    ax.grid(axis="y", alpha=0.3)


def trend(points: Sequence[Point], changes: Sequence[ChangePoint], title: str, unit: str) -> str:
    """One metric over the recorded runs, with the detected change points."""
    fig, ax = plt.subplots(figsize=(10, 2.8))
    xs = list(range(len(points)))
    errors = [p.std or 0.0 for p in points]
    ax.errorbar(xs, [p.value for p in points], yerr=errors, fmt="o-", color=MEASURED, markersize=3, capsize=2)
    for change in changes:
        ax.axvline(change.index - 0.5, color=COLORS["bad"], linestyle="--", linewidth=1)
        ax.annotate(
            f"{change.rel_change:+.1%}",
            (change.index - 0.5, 1),
            xycoords=("data", "axes fraction"),
            color=COLORS["bad"],
            fontsize=8,
            ha="left",
            va="top",
        )
    ax.set_xticks(xs, [(p.commit or "?")[:7] for p in points], rotation=45, fontsize=7, ha="right")
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    return data_uri(fig)
