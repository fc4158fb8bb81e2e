"""What training costs: money and time per sample, a stated job's estimate, energy.

A price per GPU-hour (per rank-hour on cpu) comes from the profile's
``gpu_hour_price`` or the ``perf_gpu_hour_price`` ini option / flag, in
``currency``. From a scenario's samples/s and its GPU count it gives the cost
per million samples and tokens; for a job the user states (samples x epochs)
the estimated wall time and cost of each configuration; and where the GPU has
an energy counter (NVML, Volta and newer) the energy per sample. A group's
configurations are ranked by cost and by time in the summary and the results
file. Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Job:
    """A training job the user plans: how many samples, how many times over."""

    samples: int
    """Samples per epoch."""
    epochs: int = 1
    """Passes over the samples."""


def cost_of(
    config: Mapping[str, Any],
    values: Mapping[str, float],
    health: Iterable[Mapping[str, Any]],
    price: float | None,
    currency: str,
) -> dict[str, Any] | None:
    """Cost figures of one training result (``values``: metric name -> mean); None
    without samples/s, or with neither a price nor an energy counter."""
    samples_per_s = values.get("samples_per_s")
    energy = [rank["energy_j"] for rank in health if rank.get("energy_j") is not None]
    if not samples_per_s or (price is None and not energy):
        return None
    gpus = int(config["world_size"])
    cost: dict[str, Any] = {"gpus": gpus}
    if price is not None:
        per_second = price * gpus / SECONDS_PER_HOUR
        cost.update(price_per_gpu_hour=price, currency=currency)
        cost["per_million_samples"] = per_second / samples_per_s * 1e6
        if values.get("tokens_per_s"):
            cost["per_million_tokens"] = per_second / values["tokens_per_s"] * 1e6
    samples_measured = config.get("global_batch", 0) * config.get("steps", 0)
    if energy and samples_measured:
        # Every rank's GPU, over the measured steps, per sample those steps trained.
        cost["energy_j_per_sample"] = sum(energy) / samples_measured
    return cost


def estimate(cost: Mapping[str, Any], samples_per_s: float, job: Job) -> dict[str, Any]:
    """Wall time and (when priced) cost of ``job`` at ``samples_per_s``."""
    hours = job.samples * job.epochs / samples_per_s / SECONDS_PER_HOUR
    result: dict[str, Any] = {"samples": job.samples, "epochs": job.epochs, "hours": hours}
    if "price_per_gpu_hour" in cost:
        result["cost"] = hours * cost["gpus"] * cost["price_per_gpu_hour"]
        result["currency"] = cost["currency"]
    return result


@dataclass(frozen=True)
class Entry:
    """One configuration of a group in the ranking."""

    id: str
    samples_per_s: float
    cost: Mapping[str, Any]
    job: Mapping[str, Any] | None

    @property
    def money(self) -> float | None:
        """What the ranking by cost sorts on: the job's cost, else the cost per million samples."""
        if self.job is not None and "cost" in self.job:
            return float(self.job["cost"])
        value = self.cost.get("per_million_samples")
        return None if value is None else float(value)


def rank(entries: Iterable[Entry]) -> dict[str, Any]:
    """A group's configurations by cost (cheapest first, priced ones only) and by time (fastest first)."""
    entries = list(entries)
    priced = sorted((e for e in entries if e.money is not None), key=lambda e: e.money or 0.0)
    by_time = sorted(entries, key=lambda e: -e.samples_per_s)
    return {
        "by_cost": [{"id": e.id, "cost": e.money, **({"job": dict(e.job)} if e.job else {})} for e in priced],
        "by_time": [
            {"id": e.id, "samples_per_s": e.samples_per_s, **({"hours": e.job["hours"]} if e.job else {})}
            for e in by_time
        ],
    }


def ranking(results: Iterable[Any], job: Job | None) -> dict[str, dict[str, Any]]:
    """Per group, its measured training configurations ranked (by time always, by cost when priced)."""
    groups: dict[str, list[Entry]] = {}
    for result in results:
        if result.metrics is None or "samples_per_s" not in result.metrics.values:
            continue
        cost = result.extra_metrics.get("cost") or {"gpus": result.scenario.world_size}
        samples_per_s = result.metrics.value("samples_per_s")
        entry = Entry(result.scenario.id, samples_per_s, cost, estimate(cost, samples_per_s, job) if job else None)
        groups.setdefault(result.scenario.group, []).append(entry)
    return {group: rank(entries) for group, entries in groups.items() if len(entries) > 1}


def ranking_lines(ranked: Mapping[str, Mapping[str, Any]], job: Job | None) -> list[str]:
    """The terminal summary's lines: per group, the order by cost and by time."""
    lines = []
    what = f"a job of {job.samples} samples x {job.epochs} epochs" if job else "per million samples"
    for group, order in ranked.items():
        if order["by_cost"]:
            cells = [f"{e['id'].split('.', 1)[1]} {e['cost']:.4g}" for e in order["by_cost"]]
            lines.append(f"{group} by cost ({what}): " + " < ".join(cells))
        cells = [
            f"{e['id'].split('.', 1)[1]} " + (f"{e['hours']:.3g} h" if "hours" in e else f"{e['samples_per_s']:.4g}/s")
            for e in order["by_time"]
        ]
        lines.append(f"{group} by time: " + (" < " if job else " > ").join(cells))
    return lines
