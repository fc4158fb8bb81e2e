"""``python -m perfsuite calibrate --pool FILE_OR_DIR...``: pool the calibrations several runners
made of one profile into this checkout's baselines, without launching anything.

Each input is what a runner brought back: its ``baselines/`` tree (or one profile's folder, or
one group file), or the results file (``--perf-json``) of its calibration run. Every calibrated
entry there carries its machine's launches (:mod:`perfsuite.judge.calibration`); they are merged with the
ones the local entry holds, and the entry's mean, tolerances and calibration data are computed
again from all of them. Every input is checked before anything is written: a missing file,
another profile, a scenario whose definition differs from the local baseline's, or (where the
profile judges timing on the recording processor only) sources of several processors in one
entry stop the command, naming the file and what to do. On such a profile (cpu) an input's
calibration pools into the local entry of its own processor, or becomes that processor's entry
beside the others (:mod:`perfsuite.store.baselines`); no other processor's entry is touched.
Pytest side, torch-free.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.judge import calibration, definition
from perfsuite.launch import identity
from perfsuite.store.baselines import BaselineEntry, BaselineError, BaselineStore, load_group, parse_entry


class PoolError(Exception):
    """An input cannot be pooled; the message names it and what to do."""


@dataclass(frozen=True)
class Found:
    """One calibrated entry an input holds."""

    path: Path
    profile: str
    group: str
    scenario: str
    entry: BaselineEntry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pool",
        nargs="+",
        type=Path,
        metavar="FILE_OR_DIR",
        help="pool the calibrations in these baselines trees, group files or results files "
        "(from several runners) into --into, instead of measuring",
    )
    parser.add_argument(
        "--into",
        type=Path,
        default=Path("baselines"),
        help="with --pool: the baselines folder to write (default baselines)",
    )
    parser.add_argument("--profile", help="with --pool: the profile to pool (default: the one the inputs hold)")


def run(ns: argparse.Namespace, extra: Sequence[str]) -> int:
    if extra:
        raise SystemExit(
            f"perfsuite calibrate --pool: launches nothing, so takes no pytest arguments: {' '.join(extra)}"
        )
    try:
        found = [f for path in ns.pool for f in read_input(path)]
        profile = chosen_profile(found, ns.profile, ns.pool)
        plan = planned(found, profile, ns.into)
        for (group, scenario, _), items in plan.items():
            store = BaselineStore(ns.into, profile, entry_processor(items[0]))
            print(pool_one(store, group, scenario, items), flush=True)
    except (PoolError, BaselineError) as exc:
        raise SystemExit(f"perfsuite calibrate --pool: {exc}") from None
    return 0


def read_input(path: Path) -> list[Found]:
    """The calibrated entries of one input, which must hold at least one."""
    if not path.exists():
        raise PoolError(
            f"{path}: no such file or folder. Give a runner's baselines/ folder, a group file or "
            "the --perf-json results file of its calibration run"
        )
    files = sorted(p for p in path.rglob("*.json") if "op_profiles" not in p.parts) if path.is_dir() else [path]
    found = [f for file in files for f in _entries(file, explicit=not path.is_dir())]
    if not found:
        raise PoolError(
            f"{path}: holds no calibration with per-launch values. Calibrate on that runner with "
            "this perfsuite (python -m perfsuite calibrate --repeats N) and bring back its "
            "baselines/ folder or --perf-json file"
        )
    return found


def _entries(path: Path, explicit: bool) -> Iterator[Found]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PoolError(f"{path}: cannot be read as JSON ({exc}); bring the file back whole") from None
    if isinstance(doc, dict) and "scenarios" in doc:
        for key, entries in load_group(path).items():
            for entry in (e for e in entries if calibration.sources_of(e)):  # every processor's
                yield Found(path, str(doc.get("profile")), str(doc.get("group")), key, entry)
    elif isinstance(doc, dict) and isinstance(doc.get("results"), list):
        for result in doc["results"]:
            entry = parse_entry(path, str(result.get("id")), result.get("baseline") or {})
            if calibration.sources_of(entry):
                yield Found(path, str(doc.get("profile")), str(result.get("group")), str(result.get("id")), entry)
    elif explicit:
        raise PoolError(f"{path}: neither a baseline group file nor a results file")


def chosen_profile(found: Sequence[Found], asked: str | None, inputs: Sequence[Path]) -> str:
    """The profile asked for, or the only one the inputs hold; an input with none of its entries is refused."""
    profiles = sorted({f.profile for f in found})
    if asked is None and len(profiles) > 1:
        raise PoolError(
            f"the inputs hold calibrations of several profiles ({', '.join(profiles)}): choose one with --profile"
        )
    profile = asked or profiles[0]
    for path in inputs:
        theirs = sorted({f.profile for f in found if f.path == path or path in f.path.parents})
        if profile not in theirs:
            raise PoolError(
                f"{path}: holds calibrations of profile {', '.join(theirs)}, not {profile}. Pool only "
                "runs of one profile (one kind of machine); leave this input out or pass --profile"
            )
    return profile


def entry_processor(item: Found) -> Mapping[str, Any] | None:
    """The processor whose local entry an input's calibration pools into: its own where its profile
    judges timing on the recording processor only (its calibration says so), else None (the one entry)."""
    facts = calibration.Facts.of(item.entry.extra.get(calibration.CALIBRATION) or {})
    proc = item.entry.fingerprint.get("processor")
    return None if facts.across_processors or not isinstance(proc, Mapping) else proc


def planned(found: Sequence[Found], profile: str, root: Path) -> dict[tuple[str, str, str], list[Found]]:
    """The inputs' entries per scenario and local entry (processor), each checked against the
    local baseline it is pooled into."""
    plan: dict[tuple[str, str, str], list[Found]] = {}
    for item in (f for f in found if f.profile == profile):
        proc = entry_processor(item)
        key = identity.processor_text({"processor": proc}) if proc is not None else ""
        plan.setdefault((item.group, item.scenario, key), []).append(item)
    for (group, scenario, _), items in plan.items():
        store = BaselineStore(root, profile, entry_processor(items[0]))
        base = store.own(group, scenario) or items[0].entry
        for item in items:
            check(item, base, store.path(group))
    return plan


def check(item: Found, base: BaselineEntry, local: Path) -> None:
    """Refuse an entry measured for another scenario definition, or (where timing is judged on the
    recording processor only) with sources from another processor than the local entry it pools
    into, which is that processor's own (a mixed entry: :func:`entry_processor`)."""
    changed = definition.changes(base.extra.get("definition") or {}, item.entry.extra.get("definition") or {})
    if changed:
        raise PoolError(
            f"{item.path}: {item.scenario} was calibrated for another definition than {local} holds "
            f"({'; '.join(changed)}). Calibrate that runner at this commit, or leave the file out"
        )
    facts = calibration.Facts.of(item.entry.extra.get(calibration.CALIBRATION) or {})
    processor = identity.processor_text(base.fingerprint)
    others = [s for s in calibration.sources_of(item.entry) if s.get("processor") != processor]
    if not facts.across_processors and others:
        raise PoolError(
            f"{item.path}: {item.scenario} was measured on another processor ({others[0].get('processor')}) "
            f"than {local}'s baseline ({processor}), and profile {item.profile} does not compare timing "
            "across processors. Pool only runners of one processor model"
        )


def pool_one(store: BaselineStore, group: str, scenario: str, items: Sequence[Found]) -> str:
    """Merge the inputs' sources into the local entry, under its file's lock; one line saying what came out."""
    base = store.own(group, scenario) or items[0].entry
    incoming = [s for item in items for s in calibration.sources_of(item.entry)]
    facts = calibration.Facts.of(items[-1].entry.extra.get(calibration.CALIBRATION) or {})

    def merge(old: BaselineEntry | None, new: BaselineEntry) -> BaselineEntry:
        sources = calibration.newest_per_machine(calibration.sources_of(old), incoming)
        return calibration.pooled_entry(new, sources, facts)

    entry = store.record(
        group,
        scenario,
        base.expected,
        base.metrics,
        base.fingerprint,
        tolerances=base.tolerances,
        extra=base.extra,
        merge=merge,
    )
    data: Mapping[str, Any] = entry.extra[calibration.CALIBRATION]
    primary = facts.primary or next(iter(facts.floors), "")
    return f"{scenario}: {calibration.describe(data, primary, entry.tolerances.get(primary))} -> {store.path(group)}"
