"""The card-to-card panel (issue 37, item 2): how far a row's throughput moves from one card,
or one session, to the next.

Every GPU session runs a fixed set of calibrated rows once against the committed baselines
(``docs/gpu-runs/next/panel.sh``) and appends one line per row to ``docs/gpu-runs/panel.csv``:
both sides' mean, per-step CV, step count and card UUIDs. ``sigma`` reads that table and
estimates sigma_card, the spread of one card's offset, from the log-ratios
d = ln(measured / baseline):

    E[d^2] = 2 sigma_card^2 + noise

where noise is what the two means would differ by on one card (step noise, launch to launch).
Only pairs whose two sides ran on different, known cards count, unless ``--any-card``.

    python scripts/card_panel.py append RESULTS.json --session NAME [--table docs/gpu-runs/panel.csv]
    python scripts/card_panel.py sigma [--any-card] [--exclude SCENARIO]

``append`` needs no more than the standard library; ``sigma`` needs scipy.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TABLE = ROOT / "docs" / "gpu-runs" / "panel.csv"

COLUMNS = (
    "session",
    "profile",
    "scenario",
    "metric",
    "direction",
    "tolerance",
    "verdict",
    "base_mean",
    "base_cv",
    "base_n",
    "base_launches",
    "base_uuid",
    "base_recorded_at",
    "meas_mean",
    "meas_cv",
    "meas_n",
    "meas_launches",
    "meas_uuid",
    "launch_cv",
    "delta_pct",
    "source",
)

Row = dict[str, str]


class PanelError(Exception):
    """A results file, baselines folder or table the panel cannot use; the message names the file and field."""


# -- reading a results file -------------------------------------------------------------------


def load_json(path: Path) -> Any:
    """A JSON file, plain or gzipped (run pages keep large results files gzipped)."""
    try:
        raw = path.read_bytes()
        return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, ValueError, EOFError) as exc:
        raise PanelError(f"{path}: not a readable JSON file ({exc})") from None


def need(obj: Any, key: str, kind: type | tuple[type, ...], path: Path, where: str) -> Any:
    """``obj[key]`` of type ``kind``, else an error naming the file and the field."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        name = f"{where}.{key}" if where else key
        raise PanelError(f"{path}: field {name} is missing or not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


@dataclass(frozen=True)
class Side:
    """One side of a pair: a baseline or a measurement of the row's primary metric."""

    mean: float
    cv: float
    n: int


def side(metrics: Any, metric: str, path: Path, where: str) -> Side:
    """The {mean, std, n} a result or baseline stores for ``metric``, as mean and per-step CV."""
    stored = need(metrics, metric, dict, path, where)
    mean = float(need(stored, "mean", (int, float), path, f"{where}.{metric}"))
    std = float(need(stored, "std", (int, float), path, f"{where}.{metric}"))
    n = int(need(stored, "n", int, path, f"{where}.{metric}"))
    if mean <= 0:
        raise PanelError(f"{path}: field {where}.{metric}.mean must be positive, got {mean}")
    return Side(mean, std / mean, n)


def card_uuids(gpus: Any) -> str:
    """The cards' UUIDs joined by ';', or '' when any card's is unknown (older fingerprints have none):
    a partly known set cannot say whether two sides shared a card."""
    if not isinstance(gpus, list) or not gpus:
        return ""
    found = [g.get("uuid") if isinstance(g, Mapping) else None for g in gpus]
    known = [u for u in found if isinstance(u, str) and u]
    return ";".join(sorted(known)) if len(known) == len(found) else ""


# -- append -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What every row appended from one results file shares."""

    path: Path
    session: str
    source: str
    profile: str
    meas_uuid: str
    old_baselines: Path | None


def rows_from_results(doc: Any, ctx: Context) -> tuple[list[Row], list[str]]:
    """One row per judged scenario's primary metric, and why each other scenario was skipped."""
    results = need(doc, "results", list, ctx.path, "")
    rows: list[Row] = []
    skipped: list[str] = []
    for i, result in enumerate(results):
        sid = need(result, "id", str, ctx.path, f"results[{i}]")
        row_or_why = row_of(result, ctx, f"results[{i}]")
        if isinstance(row_or_why, str):
            skipped.append(f"{sid}: {row_or_why}")
        else:
            rows.append(row_or_why)
    return rows, skipped


def row_of(result: Mapping[str, Any], ctx: Context, where: str) -> Row | str:
    """The panel row of one result, or why it has none."""
    sid = str(result["id"])
    metric = need(need(result, "config", dict, ctx.path, where), "primary", str, ctx.path, f"{where}.config")
    if result.get("status") != "ok":
        return f"status {result.get('status')}"
    metrics = need(result, "metrics", dict, ctx.path, where)
    if isinstance(metrics.get(metric), (int, float)):
        return f"{metric} is stored without its per-step spread"
    baseline = baseline_of(result, sid, ctx, where)
    if isinstance(baseline, str):
        return baseline
    meas = side(metrics, metric, ctx.path, f"{where}.metrics")
    base_metrics = need(baseline, "metrics", dict, ctx.path, f"{where}.baseline")
    base = side(base_metrics, metric, ctx.path, f"{where}.baseline.metrics")
    launches = len(metrics.get("repeats") or []) or 1
    return {
        "session": ctx.session,
        "profile": ctx.profile,
        "scenario": sid,
        "metric": metric,
        **judging(result, baseline, metric),
        **side_columns("base", base, base_launches(base, meas, launches)),
        "base_uuid": card_uuids((baseline.get("fingerprint") or {}).get("gpus")),
        "base_recorded_at": str(baseline.get("recorded_at", "")),
        **side_columns("meas", meas, launches),
        "meas_uuid": ctx.meas_uuid,
        "launch_cv": fmt((baseline.get("calibration") or {}).get(f"cv_{metric}")),
        "delta_pct": f"{(meas.mean / base.mean - 1) * 100:.3f}",
        "source": ctx.source,
    }


def judging(result: Mapping[str, Any], baseline: Mapping[str, Any], metric: str) -> Row:
    """Direction, tolerance and verdict: the gate's check of the primary metric where it made one,
    else the baseline's recorded tolerance and the metric registry's direction."""
    checks = result.get("checks")
    found = (
        [c for c in checks if isinstance(c, Mapping) and c.get("metric") == metric] if isinstance(checks, list) else []
    )
    check: Mapping[str, Any] = found[0] if found else {}
    return {
        "direction": str(check.get("direction") or direction_of(metric)),
        "tolerance": fmt(check.get("tolerance", (baseline.get("tolerances") or {}).get(metric))),
        "verdict": str(result.get("verdict", "")),
    }


def baseline_of(result: Mapping[str, Any], sid: str, ctx: Context, where: str) -> Mapping[str, Any] | str:
    """The baseline the measurement is compared with: the result's own, or with ``--baselines`` the
    entry in that folder (a recording run's result carries the baseline it just wrote, itself)."""
    if ctx.old_baselines is not None:
        group = need(result, "group", str, ctx.path, where)
        path = ctx.old_baselines / ctx.profile / f"{group}.json"
        entries = need(load_json(path), "scenarios", dict, path, "") if path.exists() else {}
        return entries.get(sid) or f"no baseline in {path}"
    if result.get("verdict") == "recorded":
        return "recorded in this run (pass --baselines with the folder as it was before)"
    baseline = result.get("baseline")
    return need(result, "baseline", dict, ctx.path, where) if baseline is not None else "no baseline"


def direction_of(metric: str) -> str:
    """Which way is better, from perfsuite's registry when the results file has no check saying it."""
    try:
        from perfsuite.core.metrics import METRICS
    except ImportError:  # only reached for a result without checks, run where perfsuite is not installed
        return ""
    return METRICS.get(metric).direction


def base_launches(base: Side, meas: Side, meas_launches: int) -> int:
    # A baseline does not say how many launches its steps pooled (a calibration's repeats
    # outlive a later one-launch re-recording), but every launch of a row runs the same steps.
    per_launch = meas.n / meas_launches
    return max(1, round(base.n / per_launch)) if per_launch > 0 else 1


def side_columns(prefix: str, values: Side, launches: int) -> Row:
    return {
        f"{prefix}_mean": fmt(values.mean),
        f"{prefix}_cv": fmt(values.cv),
        f"{prefix}_n": str(values.n),
        f"{prefix}_launches": str(launches),
    }


def fmt(value: Any) -> str:
    """A number as the table keeps it (6 significant digits), '' for unknown."""
    return "" if value is None or value == "" else f"{float(value):.6g}"


def read_table(path: Path) -> list[Row]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise PanelError(f"{path}: not a panel table, columns {sorted(missing)} are missing")
        return list(reader)


def write_rows(path: Path, rows: Iterable[Row], header: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)


def append(args: argparse.Namespace) -> int:
    path = Path(args.results)
    doc = load_json(path)
    ctx = Context(
        path=path,
        session=args.session or default_session(path),
        source=args.source or str(path),
        profile=need(doc, "profile", str, path, ""),
        meas_uuid=card_uuids((doc.get("machine") or {}).get("gpus")),
        old_baselines=Path(args.baselines) if args.baselines else None,
    )
    rows, skipped = rows_from_results(doc, ctx)
    table = read_table(Path(args.table))
    have = {(r["session"], r["scenario"]) for r in table}
    new = [r for r in rows if (r["session"], r["scenario"]) not in have]
    fresh = not Path(args.table).exists() or Path(args.table).stat().st_size == 0
    write_rows(Path(args.table), new, header=fresh)
    for why in skipped:
        print(f"skipped {why}", file=sys.stderr)
    print(f"{args.table}: {len(new)} row(s) added, {len(rows) - len(new)} already there (session {ctx.session})")
    return 0


def default_session(path: Path) -> str:
    # The file's time, so appending the same file twice names the same session.
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H%MZ")


# -- sigma ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    scenario: str
    d: float
    """ln(measured / baseline)."""
    noise: float
    """Expected d^2 on one card: the variance of the two means (0 where steps and launches are unknown)."""
    noise_known: bool
    kind: str
    """cross (two known, disjoint card sets), same (a card in common) or unknown."""
    slower: bool | None
    """Slower than its tolerance; None where the row records no tolerance or direction."""


def pair_of(row: Row) -> Pair:
    d = math.log(float(row["meas_mean"]) / float(row["base_mean"]))
    base, meas = side_noise(row, "base"), side_noise(row, "meas")
    return Pair(
        row["scenario"], d, (base or 0.0) + (meas or 0.0), None not in (base, meas), card_kind(row), slower(row)
    )


def side_noise(row: Row, prefix: str) -> float | None:
    """Variance of one side's log-mean: step noise cv^2/n, or the row's launch-to-launch CV over
    the side's launches where that is larger (a calibrated baseline records it: step noise alone
    misses what moves between launches, 10% for the Trainer row against 1.5% from its steps)."""
    cv, n, launches, launch_cv = (
        row.get(k, "") for k in (f"{prefix}_cv", f"{prefix}_n", f"{prefix}_launches", "launch_cv")
    )
    steps = float(cv) ** 2 / float(n) if cv and n else None
    between = float(launch_cv) ** 2 / float(launches or 1) if launch_cv else None
    known = [v for v in (steps, between) if v is not None]
    return max(known) if known else None


def card_kind(row: Row) -> str:
    base, meas = set(filter(None, row["base_uuid"].split(";"))), set(filter(None, row["meas_uuid"].split(";")))
    if not base or not meas:
        return "unknown"
    return "same" if base & meas else "cross"


def slower(row: Row) -> bool | None:
    if not row.get("tolerance") or row.get("direction") not in ("higher", "lower"):
        return None
    change = float(row["meas_mean"]) / float(row["base_mean"]) - 1
    loss = -change if row["direction"] == "higher" else change
    return loss > float(row["tolerance"])


@dataclass(frozen=True)
class Estimate:
    n: int
    rms: float
    rms_ci: tuple[float, float]
    noise: float
    """RMS of the pairs' expected one-card difference."""
    sigma: float
    sigma_ci: tuple[float, float]


def estimate(pairs: Sequence[Pair], level: float = 0.95) -> Estimate:
    """sigma_card from E[d^2] = 2 sigma^2 + noise. d^2 is taken about 0, not the pairs' mean: both
    sides are draws of one row on one profile, so a common offset between them is card spread too.
    The interval treats sum(d^2) / E[d^2] as chi-square with n degrees of freedom (normal d, one
    variance: exact when the pairs' noise is alike, approximate otherwise)."""
    from scipy.stats import chi2  # here, so that append runs without scipy

    n = len(pairs)
    total = sum(p.d**2 for p in pairs)
    noise = sum(p.noise for p in pairs) / n
    tail = (1 - level) / 2
    ms_ci = (total / float(chi2.ppf(1 - tail, n)), total / float(chi2.ppf(tail, n)))
    return Estimate(
        n,
        math.sqrt(total / n),
        (math.sqrt(ms_ci[0]), math.sqrt(ms_ci[1])),
        math.sqrt(noise),
        card_sigma(total / n, noise),
        (card_sigma(ms_ci[0], noise), card_sigma(ms_ci[1], noise)),
    )


def card_sigma(mean_square: float, noise: float) -> float:
    return math.sqrt(max(0.0, (mean_square - noise) / 2))


def weighted(pairs: Sequence[Pair], level: float = 0.95, points: int = 4000) -> Estimate:
    """sigma_card by maximum likelihood, d ~ N(0, 2 sigma^2 + noise) per pair, over a grid; the
    interval is where the log-likelihood is within chi2(1)/2 of its top. Unlike the pooled mean of
    d^2, it weighs a quiet row's pair above a noisy one's (a power-capped matmul's 20 steps spread 3-12%)."""
    import numpy as np
    from scipy.stats import chi2

    d2 = np.array([p.d**2 for p in pairs])
    noise = np.array([p.noise for p in pairs])
    grid = np.linspace(0.0, max(0.01, 2 * math.sqrt(float(d2.max()))), points + 1)
    # One row per grid point; the 1e-12 keeps a noise-free pair finite at sigma_card = 0.
    variances = 2 * grid[:, None] ** 2 + noise[None, :] + 1e-12
    scores = -0.5 * (np.log(variances) + d2[None, :] / variances).sum(axis=1)
    inside = grid[scores.max() - scores <= float(chi2.ppf(level, 1)) / 2]
    plain = estimate(pairs, level)
    best = float(grid[int(scores.argmax())])
    return Estimate(plain.n, plain.rms, plain.rms_ci, plain.noise, best, (float(inside.min()), float(inside.max())))


def report(pairs: Sequence[Pair], label: str) -> list[str]:
    """The per-row table and the pooled line."""
    lines = [
        f"{'scenario':<34} {'pairs':>5}  {'RMS d':>6} {'95% interval':>13}  {'noise':>6}  {'sigma_card':>10} {'95% interval':>13}"
    ]
    by_row: dict[str, list[Pair]] = {}
    for p in pairs:
        by_row.setdefault(p.scenario, []).append(p)
    for scenario in sorted(by_row):
        lines.append(line(scenario, estimate(by_row[scenario])))
    lines.append(line(f"pooled ({len(by_row)} rows, {label})", estimate(pairs)))
    lines.append(line("pooled, weighted by noise (ML)", weighted(pairs)))
    return lines


def line(name: str, e: Estimate) -> str:
    def pct(x: float) -> str:
        return f"{x * 100:.2f}%"

    rms_ci = f"{pct(e.rms_ci[0])}-{pct(e.rms_ci[1])}"
    sigma_ci = f"{pct(e.sigma_ci[0])}-{pct(e.sigma_ci[1])}"
    return f"{name:<34} {e.n:>5}  {pct(e.rms):>6} {rms_ci:>13}  {pct(e.noise):>6}  {pct(e.sigma):>10} {sigma_ci:>13}"


def sigma(args: argparse.Namespace) -> int:
    every = table_pairs(Path(args.table), set(args.exclude))
    counted = every if args.any_card else [p for p in every if p.kind == "cross"]
    for text in summary_lines(every, counted, args.any_card):
        print(text)
    if not counted:
        print("no pairs to estimate from" + ("" if args.any_card else ": pass --any-card to use every pair"))
        return 1
    print("\n".join(report(counted, "any card" if args.any_card else "cross-card")))
    return 0


def table_pairs(path: Path, exclude: set[str]) -> list[Pair]:
    pairs = []
    for line_no, row in enumerate(read_table(path), start=2):  # line 1 is the header
        if row["scenario"] in exclude:
            continue
        try:
            pairs.append(pair_of(row))
        except (ValueError, ZeroDivisionError) as exc:
            raise PanelError(f"{path}: line {line_no} ({row['scenario']}): {exc}") from None
    return pairs


def summary_lines(every: Sequence[Pair], counted: Sequence[Pair], any_card: bool) -> list[str]:
    kinds = {k: sum(p.kind == k for p in every) for k in ("cross", "same", "unknown")}
    judged = [p.slower for p in counted if p.slower is not None]
    lines = [
        f"{len(every)} pair(s): {kinds['cross']} cross-card, {kinds['same']} same-card, {kinds['unknown']} with an unknown card",
        f"counted: {len(counted)}"
        + ("" if any_card else f" (excluded: {kinds['same']} same-card, {kinds['unknown']} unknown-card)"),
        f"slower than their tolerance: {sum(judged)} of {len(judged)} counted row-sessions with a tolerance",
        "d = ln(measured/baseline); RMS d about 0; noise: the pairs' expected RMS d on one card "
        "(step CV^2/n, or the calibrated launch CV^2 over launches where larger); "
        "sigma_card = sqrt((RMS d^2 - noise^2) / 2), clamped at 0; intervals: chi-square on sum d^2; "
        "the weighted line: maximum likelihood with d ~ N(0, 2 sigma_card^2 + noise), likelihood-ratio interval",
    ]
    unknown_noise = sum(not p.noise_known for p in counted)
    if unknown_noise:
        lines.append(f"{unknown_noise} pair(s) without step counts: taken as noise-free (sigma_card an upper bound)")
    return lines


# -- command line -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command")
    add = sub.add_parser("append", help="append a gate run's results file (--perf-json) to the table")
    add.add_argument("results", help="results file, plain or .gz")
    add.add_argument("--session", help="session name (default: the file's time)")
    add.add_argument("--source", help="where the data came from (default: the results file's path)")
    add.add_argument(
        "--baselines",
        help="baselines folder the run was judged against as it was before the run; needed for a "
        "--perf-update-baselines run, whose results carry the baseline they just wrote",
    )
    add.add_argument("--table", default=str(DEFAULT_TABLE))
    est = sub.add_parser("sigma", help="sigma_card per row and pooled (the default)")
    est.add_argument("--table", default=str(DEFAULT_TABLE))
    est.add_argument("--any-card", action="store_true", help="count every pair, not only cross-card ones")
    est.add_argument("--exclude", action="append", default=[], metavar="SCENARIO", help="leave a row out (repeatable)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("append", "sigma", "-h", "--help"):
        argv.insert(0, "sigma")
    args = parser().parse_args(argv)
    try:
        return append(args) if args.command == "append" else sigma(args)
    except PanelError as exc:
        print(f"card_panel: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
