"""``python -m perfsuite selftest --simulate``: the printed rates, the trials beside them, and each
committed row's smallest detectable slowdown."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfsuite.judge.abtest import REV_TOLERANCE as AB_REV_TOLERANCE
from perfsuite.judge.simulate import model, realgate, trials
from perfsuite.judge.simulate.noise import PROFILES, ProfileNoise, Row, noise_of, primary_of, row_of, typical_row
from perfsuite.judge.simulate.rates import Rate, detectable, rate
from perfsuite.spec.profiles import CPU, HardwareProfile, gpu_profile
from perfsuite.store.baselines import BaselineError, BaselineStore

LEVELS = (0.0, 3.0, 5.0, 10.0)


@dataclass(frozen=True)
class Options:
    profiles: tuple[str, ...] = tuple(PROFILES)
    baselines: Path = Path("baselines")
    levels: tuple[float, ...] = LEVELS
    draws: int = 100_000
    pairs: tuple[int, ...] = (3, 10)
    seed: int = 0
    check: int = 1000
    """Draws a level that also go through the gate's own judging code."""
    histories: int = 20_000
    """Simulated histories of the committed trials."""
    observed: tuple[trials.Trials, ...] = trials.COMMITTED


def options(ns: argparse.Namespace) -> Options:
    chosen = tuple(name for given in ns.profile or () for name in given.split(",")) or tuple(PROFILES)
    pairs = tuple(int(p) for p in ns.pairs)
    if min(pairs) < 2 or any(p != int(p) for p in ns.pairs):
        raise ValueError(f"--pairs takes whole numbers of 2 or more (a paired test needs 2), got {ns.pairs}")
    return Options(chosen, ns.baselines, ns.levels or LEVELS, ns.draws, pairs, ns.seed, min(1000, ns.draws))


def run(ns: argparse.Namespace) -> int:
    try:
        chosen = options(ns)
        for name in chosen.profiles:
            noise_of(name)
    except ValueError as exc:
        print(f"perfsuite selftest --simulate: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    for line in report(chosen):
        print(line, flush=True)
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


def report(chosen: Options) -> Iterator[str]:
    yield (
        f"perfsuite selftest --simulate: {chosen.draws:,} modelled runs a level, the first {chosen.check:,} also judged "
        "by the gate's own code (judging.judge, the session's confirmation, abtest.compare); 95% Wilson intervals"
    )
    for name in chosen.profiles:
        noise = noise_of(name)
        profile = hardware(noise)
        yield ""
        yield from components(noise, profile)
        yield from levels_table(noise, profile, chosen)
        yield from observed(noise, profile, chosen)
        yield from detectable_table(noise, profile, chosen)


def hardware(noise: ProfileNoise) -> HardwareProfile:
    """The gate's own profile object (its CV limit and spread rule judge the draws)."""
    return CPU if noise.profile == "cpu" else gpu_profile(noise.profile)


def components(noise: ProfileNoise, profile: HardwareProfile) -> Iterator[str]:
    yield f"== {noise.profile}: CV limit {profile.max_cv:.0%}, spread rule {profile.max_spread_growth or 'off'}, 1 confirmation"
    for label, figure in (
        ("per step", noise.step_cv),
        ("per launch", noise.launch_cv),
        ("per session", noise.session_cv),
    ):
        yield f"  {label:<12}{figure.value:6.2%}  {figure.source}"


def pct(x: float) -> str:
    return f"{x:+.1%}"


def levels_table(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    row, rules = typical_row(noise, profile), model.Rules.of(profile)
    rng = np.random.default_rng(chosen.seed)
    gate = model.gate_draws(row, rules, rng, chosen.draws)
    pairs = chosen.pairs[0]
    paired = model.pair_draws(row, pairs, rng, chosen.draws)
    yield (
        f"  a typical row: {row.steps} steps a launch, baseline of {row.baseline_launches} launch(es), tolerance "
        f"{row.tolerance:.1%}; ab-rev {pairs} pairs at its tolerance {AB_REV_TOLERANCE:.0%}"
    )
    yield f"  {'slowdown':>8}  {'throughput':>10}  {'gate fails':<26}{'gate, own code':<30}ab-rev fails"
    for level in chosen.levels:
        s = level / 100
        modelled = model.gate_verdicts(gate, row, rules, s) == model.REGRESSION
        real = realgate.gate_verdicts(gate, row, profile, rules.confirm, s, chosen.check) == model.REGRESSION
        agree = "agrees" if rate(real).overlaps(rate(modelled)) else "DISAGREES"
        own = f"{rate(real).show()} {agree}"
        ab = rate(model.ab_verdicts(paired, AB_REV_TOLERANCE, s)).show()
        yield f"  {level:>7g}%  {pct(-s / (1 + s)):>10}  {rate(modelled).show():<26}{own:<30}{ab}"


def rows_for(noise: ProfileNoise, profile: HardwareProfile, baselines: Path) -> Callable[[trials.Trials], Row]:
    """Each trial's row from its committed baseline (the typical row where there is none)."""
    store = BaselineStore(baselines, noise.profile)

    def row(t: trials.Trials) -> Row:
        try:
            found = store.get(t.scenario.split(".")[0], t.scenario)
        except BaselineError:
            found = None
        metric = primary_of(found) if found is not None else None
        return row_of(found, metric, profile, noise) if found is not None and metric else typical_row(noise, profile)

    return row


def observed(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    mine = [t for t in chosen.observed if t.profile == noise.profile]
    if not mine:
        return
    rows = rows_for(noise, profile, chosen.baselines)
    found = trials.simulate(mine, rows, model.Rules.of(profile), chosen.histories, chosen.seed)
    yield f"  committed trials against the model ({chosen.histories:,} simulated histories; each row's own baseline):"
    for s in found:
        t = s.trials
        what = f"{t.mode} {t.scenario} " + (f"({t.pairs} pairs)" if t.mode == "ab" else f"[{t.session}]")
        side = ">=" if t.failed >= s.failed.mean() else "<="
        tail = s.tail()
        yield (
            f"    {what:<46}{t.level:>4.0%}: {t.failed}/{t.trials} failed; model {s.failed.mean() / t.trials:6.1%} a "
            f"trial, P({side}{t.failed} of {t.trials}) = {probability(tail, chosen.histories)}: {verdict(tail)}"
        )
    for mode in ("gate", "ab"):
        yield from pooled_false_alarms(mode, [s for s in found if s.trials.mode == mode], chosen.histories)


def probability(tail: float, histories: int) -> str:
    """A simulated tail probability; none of the histories is "under 1 in that many", not 0."""
    return f"{tail:.3g}" if tail else f"< {1 / histories:.1g}"


def verdict(tail: float) -> str:
    return "model rejected" if tail < trials.REJECT_BELOW else "consistent"


def pooled_false_alarms(mode: str, found: Sequence[trials.Simulated], histories: int) -> Iterator[str]:
    pooled = trials.false_alarms(found)
    if pooled is None:
        return
    yield (
        f"    {mode}, every 0% trial: observed {pooled.failed}/{pooled.trials} false alarms; the model predicts "
        f"{pooled.per_trial:.2%} a trial; P(>={pooled.failed} of {pooled.trials} | model) = {probability(pooled.tail, histories)}: "
        f"{verdict(pooled.tail)}"
    )
    if pooled.worst is not None and pooled.worst_tail is not None:
        yield (
            f"    {mode}, worst 0% reading {pooled.worst:+.1%}: P(a trial reads that low | model) = "
            f"{probability(pooled.worst_tail, histories)}: {verdict(pooled.worst_tail)}"
        )


def show(slowdown: float | None) -> str:
    """A slowdown and the throughput drop it makes, or why there is none."""
    if slowdown is None:
        return "not caught"
    return f"{slowdown:.0%} ({pct(-slowdown / (1 + slowdown))})"


def committed_rows(noise: ProfileNoise, profile: HardwareProfile, baselines: Path) -> Iterator[tuple[str, Row]]:
    folder = baselines / noise.profile
    store = BaselineStore(baselines, noise.profile)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            entries = store.group(path.stem)
        except BaselineError:
            continue  # not a group file (bootstrap-costs.json)
        for scenario, entry in sorted(entries.items()):
            metric = primary_of(entry)
            if entry.expected == "ok" and metric and float(entry.metrics[metric].get("mean") or 0):
                yield scenario, row_of(entry, metric, profile, noise)


def detectable_table(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    rows = list(committed_rows(noise, profile, chosen.baselines))
    if not rows:
        yield f"  no committed baselines under {chosen.baselines / noise.profile}"
        return
    rules = model.Rules.of(profile)
    head = "".join(f"{f'ab-rev {p} pairs':<20}" for p in chosen.pairs)
    yield f"  smallest slowdown caught 9 times in 10 (throughput change), each row from {chosen.baselines / noise.profile}:"
    yield f"    {'scenario':<42}{'step CV':>8}{'launch':>8}{'tol':>7}  {'gate':<20}{head}"
    for scenario, row in rows:
        ab = "".join(f"{show(detectable(row, rules, p)):<20}" for p in chosen.pairs)
        yield (
            f"    {scenario:<42}{row.step_cv:8.1%}{row.launch_cv:8.2%}{row.tolerance:7.1%}  "
            f"{show(detectable(row, rules)):<20}{ab}"
        )


__all__ = ["LEVELS", "Options", "Rate", "options", "report", "run"]
