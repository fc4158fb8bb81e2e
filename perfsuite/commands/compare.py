"""``python -m perfsuite compare OLD.json NEW.json``: two results files side by side, per scenario,
launching nothing.

Two nights, two runners or two branches each leave a ``--perf-json`` file; this prints, per row,
its headline metric (the config's ``primary``) and peak memory in both, the change, and for the
headline the 95% Welch t-interval of the change from each side's per-step mean, spread and count.
It says what differs between the two profiles and machines (cards, processor, drivers, packages)
above the table, since a change across machines is the hardware's as much as the code's. Rows in
one file only, and rows one side did not measure, are listed with why. ``--fail-on PCT`` turns it
into a gate on the point estimate. Rows whose counted step work differs are named first, with
the difference, exactly. Pytest side, torch-free.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.core import metrics as registry
from perfsuite.core import workcount
from perfsuite.core.protocol import work_count_of
from perfsuite.core.text import table
from perfsuite.judge.compare import welch_interval
from perfsuite.judge.stats import Summary
from perfsuite.launch import identity
from perfsuite.reports.html import results as res

#: Confidence of the headline's interval.
CONFIDENCE = 0.95
PEAK = "peak_mem_mib"
COLUMNS = ("scenario", "headline", "OLD", "NEW", "change", "95% interval", "peak MiB", "peak change", "note")
#: Scalar fingerprint fields shown when they differ, by label.
MACHINE_FIELDS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("host", lambda m: str(m.get("host") or "?")),
    ("GPUs", lambda m: ", ".join(_card(g) for g in m.get("gpus") or [] if isinstance(g, Mapping)) or "none"),
    ("processor", identity.processor_text),
    ("driver", lambda m: str(m.get("driver") or "?")),
    ("CUDA driver", lambda m: str(m.get("cuda_driver") or "?")),
    ("python", lambda m: str(m.get("python") or "?")),
)


def add_parser(commands: Any) -> None:
    """The ``compare`` subcommand on perfsuite's argparse subparsers."""
    compare = commands.add_parser(
        "compare", help="print two results files side by side: headline and peak memory per scenario, with changes"
    )
    compare.add_argument("old", type=Path, metavar="OLD", help="the earlier results file (pytest --perf-json FILE)")
    compare.add_argument("new", type=Path, metavar="NEW", help="the later results file, compared against OLD")
    compare.add_argument("-k", dest="keyword", help="only scenarios whose id contains this text")
    compare.add_argument("--markdown", action="store_true", help="as markdown, e.g. >> $GITHUB_STEP_SUMMARY")
    compare.add_argument(
        "--fail-on",
        type=percent,
        metavar="PCT",
        help="exit 1 when a row's headline mean in NEW is worse than in OLD by more than PCT%% of OLD's mean (the "
        "'change' column's point estimate, whatever its interval: below -PCT%% for a throughput); rows in one "
        "file only, or not measured in either, do not count",
    )


def percent(text: str) -> float:
    """A percentage, 0 or more: ``10`` or ``10%``."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage; give e.g. 10 for 10%") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a percentage of 0 or more, got {text!r}")
    return value


@dataclass(frozen=True)
class Change:
    """One metric of a scenario in OLD and in NEW."""

    metric: str
    old: Summary
    new: Summary

    @property
    def relative(self) -> float:
        """NEW's mean against OLD's, signed: +0.10 is 10% higher."""
        return self.new.mean / self.old.mean - 1 if self.old.mean else math.nan

    @property
    def worse(self) -> float:
        """The relative change turned so that above 0 is worse (a lower throughput, a higher peak)."""
        higher = self.metric not in registry.METRICS or registry.get(self.metric).direction == "higher"
        return -self.relative if higher else self.relative

    def interval(self) -> tuple[float, float] | None:
        """The interval of the change as a fraction of OLD's mean; None where a side has no spread."""
        found = welch_interval(self.old, self.new, CONFIDENCE)
        if found is None or not self.old.mean:
            return None
        return found[0] / self.old.mean, found[1] / self.old.mean


@dataclass(frozen=True)
class Row:
    """One scenario id across the two files."""

    id: str
    headline: Change | None = None
    peak: Change | None = None
    note: str = ""
    """Why the headline is not compared (one file only, not measured, another metric), else ""."""


def figure(metrics: Mapping[str, Any] | None, name: str) -> Summary | None:
    """A metric as the file keeps it: ``{mean, std, n}`` over the steps, or one number (n = 1)."""
    node = (metrics or {}).get(name)
    if not isinstance(node, Mapping):
        number = res.number(node)
        return None if number is None else Summary(number, 0.0, 1)
    mean, std, n = (res.number(node.get(key)) for key in ("mean", "std", "n"))
    if mean is None:
        return None
    return Summary(mean, std or 0.0, int(n) if n and std is not None else 1)


def pair(old: res.Result, new: res.Result) -> Row:
    """A scenario both files hold."""
    unmeasured = [f"{side} {r['status']}" for side, r in (("OLD", old), ("NEW", new)) if r["status"] != "ok"]
    if unmeasured:
        return Row(old["id"], note="not measured: " + ", ".join(unmeasured))
    metric, other = res.primary_metric(old), res.primary_metric(new)
    peak = _change(PEAK, old, new)
    if metric is None or metric != other:
        return Row(old["id"], peak=peak, note=f"headline differs: {metric or '?'} in OLD, {other or '?'} in NEW")
    headline = _change(metric, old, new)
    if headline is None:
        side = "OLD" if figure(old.get("metrics"), metric) is None else "NEW"
        return Row(old["id"], peak=peak, note=f"no {metric} value in {side}")
    return Row(old["id"], headline, peak)


def _change(metric: str, old: res.Result, new: res.Result) -> Change | None:
    before, after = figure(old.get("metrics"), metric), figure(new.get("metrics"), metric)
    return Change(metric, before, after) if before is not None and after is not None else None


def rows(old: Mapping[str, Any], new: Mapping[str, Any], keyword: str | None = None) -> list[Row]:
    """Every scenario of either file whose id holds ``keyword``: OLD's order, then NEW's own rows."""
    before = {r["id"]: r for r in old["results"] if not keyword or keyword in r["id"]}
    after = {r["id"]: r for r in new["results"] if not keyword or keyword in r["id"]}
    found = [pair(r, after[i]) if i in after else Row(i, note="only in OLD") for i, r in before.items()]
    return found + [Row(i, note="only in NEW") for i in after if i not in before]


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between the two runs' profiles and machines, one line each."""
    found = [f"profile: {old['profile']} -> {new['profile']}"] if old["profile"] != new["profile"] else []
    a, b = (doc["machine"] if isinstance(doc.get("machine"), Mapping) else {} for doc in (old, new))
    for label, read in MACHINE_FIELDS:
        if read(a) != read(b):
            found.append(f"{label}: {read(a)} -> {read(b)}")
    found += identity.card_setting_changes(a, b)
    for label in ("packages", "runtime"):
        moved = _versions(a.get(label), b.get(label))
        found += [f"{label}: {moved}"] if moved else []
    return found


def work_changes(old: Mapping[str, Any], new: Mapping[str, Any], keyword: str | None = None) -> list[str]:
    """Each scenario whose counted step work differs between the files, exactly, one line each:
    what the step does, said before how fast it ran (which the machine moves too)."""
    before = {r["id"]: work_count_of(r) for r in old["results"]}
    found = []
    for r in new["results"]:
        then, now = before.get(r["id"]), work_count_of(r)
        if (keyword and keyword not in r["id"]) or then is None or now is None:
            continue
        diff = workcount.compare(then, now)
        if diff.changed:
            found.append(f"{r['id']}: {diff.describe()}")
    return found


def _card(gpu: Mapping[str, Any]) -> str:
    return f"GPU {gpu.get('index', '?')} {identity.describe_card(gpu)}"


def _versions(old: Any, new: Any) -> str:
    old, new = old if isinstance(old, Mapping) else {}, new if isinstance(new, Mapping) else {}
    names = [n for n in dict.fromkeys([*old, *new]) if old.get(n) != new.get(n)]
    return ", ".join(f"{n} {old.get(n, '-')} -> {new.get(n, '-')}" for n in names)


def too_slow(row: Row, fail_on: float | None) -> bool:
    """Whether ``--fail-on`` fails this row: its headline worse by more than ``fail_on`` percent."""
    return fail_on is not None and row.headline is not None and row.headline.worse * 100 > fail_on


def cells(row: Row, fail_on: float | None) -> tuple[str, ...]:
    """One row under :data:`COLUMNS`."""
    head, peak = row.headline, row.peak
    old = new = change = interval = "-"
    if head is not None:
        old, new, change = _show(head.metric, head.old), _show(head.metric, head.new), _percent(head.relative)
        found = head.interval()
        interval = f"{_percent(found[0])} .. {_percent(found[1])}" if found else "-"
    peaks = f"{peak.old.mean:.0f} -> {peak.new.mean:.0f}" if peak is not None else "-"
    note = row.note or (f"worse by more than {fail_on:g}%" if too_slow(row, fail_on) else "")
    name = head.metric if head is not None else "-"
    return (row.id, name, old, new, change, interval, peaks, _percent(peak.relative) if peak else "-", note)


def _show(metric: str, value: Summary) -> str:
    known = registry.get(metric) if metric in registry.METRICS else None
    return known.show(value.mean) if known is not None else f"{value.mean:.4g}"


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{fraction:+.1%}"


def tally(found: Sequence[Row], fail_on: float | None) -> str:
    """The line under the table: how many rows were compared, and what ``--fail-on`` found."""
    notes = [r.note.split(":")[0] for r in found if r.headline is None]
    kinds = ", ".join(f"{notes.count(n)} {n}" for n in dict.fromkeys(notes))
    line = f"{len(found)} scenario(s): {len(found) - len(notes)} compared" + (f", {kinds}" if kinds else "")
    if fail_on is None:
        return line
    slow = [r.id for r in found if too_slow(r, fail_on)]
    verdict = f"{len(slow)} worse by more than {fail_on:g}%: {', '.join(slow)}" if slow else "none worse"
    return f"{line}; --fail-on {fail_on:g}%: {verdict}"


def text(
    old: Path, new: Path, found: Sequence[Row], changed: Sequence[str], fail_on: float | None, work: Sequence[str] = ()
) -> str:
    """The comparison for a terminal."""
    lines = [f"perfsuite compare: OLD {old} -> NEW {new}"]
    lines += ["step work changed (exact):", *(f"  {line}" for line in work)] if work else []
    lines += ["OLD and NEW differ in:", *(f"  {line}" for line in changed)] if changed else ["same profile and machine"]
    lines += table(COLUMNS, (cells(r, fail_on) for r in found))
    return "\n".join([*lines, tally(found, fail_on)]) + "\n"


def markdown(
    old: Path, new: Path, found: Sequence[Row], changed: Sequence[str], fail_on: float | None, work: Sequence[str] = ()
) -> str:
    """The comparison as a job-summary section (``$GITHUB_STEP_SUMMARY``)."""
    lines = [f"## perfsuite compare: `{old}` -> `{new}`", ""]
    lines += ["Step work changed (exact):", "", *(f"- {_md(line)}" for line in work), ""] if work else []
    lines += (
        ["OLD and NEW differ in:", "", *(f"- {_md(line)}" for line in changed)]
        if changed
        else ["Same profile and machine."]
    )
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in found:
        first, *rest = cells(row, fail_on)
        lines.append("| " + " | ".join([f"`{first}`", *map(_md, rest)]) + " |")
    return "\n".join([*lines, "", tally(found, fail_on)]) + "\n"


def _md(text: str) -> str:
    """A table cell or list item: a pipe would end the cell."""
    return text.replace("|", "\\|")


def load(path: Path) -> dict[str, Any]:
    """A results file with at least one result; :class:`res.ReportInputError` names the file otherwise."""
    document = res.load_results(path)
    if not document["results"]:
        raise res.ReportInputError(f"{path}: holds no results (its run selected no scenario); give a run's file")
    return document


def run(ns: argparse.Namespace) -> int:
    """0 when compared (and nothing beyond ``--fail-on``), 1 when a row is, 2 for a bad file."""
    try:
        old, new = load(ns.old), load(ns.new)
    except res.ReportInputError as exc:
        print(f"perfsuite compare: {exc}", file=sys.stderr)
        return 2
    found = rows(old, new, ns.keyword)
    if not found:
        print(f"perfsuite compare: -k {ns.keyword!r} matches no scenario of {ns.old} or {ns.new}", file=sys.stderr)
        return 2
    render = markdown if ns.markdown else text
    sys.stdout.write(
        render(ns.old, ns.new, found, differences(old, new), ns.fail_on, work_changes(old, new, ns.keyword))
    )
    return 1 if any(too_slow(r, ns.fail_on) for r in found) else 0
