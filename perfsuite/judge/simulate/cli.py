"""``python -m perfsuite selftest --simulate``: the printed rates of the stored-baseline gate and of
the sequential A/B, the trials beside them, and each committed row's A/B figures and smallest
detectable slowdown."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from perfsuite.core.profiles import CPU, HardwareProfile, gpu_profile
from perfsuite.core.workloads import TIERS, tiers_up_to
from perfsuite.judge import sequential
from perfsuite.judge.sequential import Design
from perfsuite.judge.simulate import family, model, realgate, trials
from perfsuite.judge.simulate.noise import (
    PROFILES,
    ProfileNoise,
    Row,
    min_effect_of,
    noise_of,
    primary_of,
    row_of,
    typical_row,
)
from perfsuite.judge.simulate.rates import ab_detectable, detectable, rate, share
from perfsuite.store.baselines import BaselineError, BaselineStore

LEVELS = (0.0, 3.0, 5.0, 10.0)
#: The minimum effect whose cost the typical row also shows (what would 1% take?)...
FINE_EFFECT = 0.01
#: ...at the chosen most pairs and at this many, enough for it to decide on the H100's typical row...
FINE_PAIRS = 20
#: ...from at most this many A/Bs a level (+-0.4 percentage point at 90%; 20 pairs cost 2.5x 8).
FINE_DRAWS = 20_000
#: Modelled A/Bs a level of each committed row (and of its smallest detectable slowdown's search):
#: +-0.5 percentage point at 90%, and the 65 cpu and H100 rows in seconds.
ROW_DRAWS = 4000


@dataclass(frozen=True)
class Options:
    profiles: tuple[str, ...] = tuple(PROFILES)
    baselines: Path = Path("baselines")
    levels: tuple[float, ...] = LEVELS
    draws: int = 100_000
    max_pairs: int = sequential.MAX_PAIRS
    """The sequential A/B's most pairs (``ab-rev --max-pairs``)."""
    seed: int = 0
    check: int = 1000
    """Draws a level that also go through the gate's own judging code, and the A/B's."""
    row_draws: int = ROW_DRAWS
    """Modelled A/Bs a level of each committed row."""
    histories: int = 20_000
    """Simulated histories of the committed trials."""
    observed: tuple[trials.Trials, ...] = trials.COMMITTED
    tiers: Mapping[str, str] = field(default_factory=dict)
    """Scenario id -> its tier, as collecting the suite found them (empty: not collected)."""


def options(ns: argparse.Namespace) -> Options:
    chosen = tuple(name for given in ns.profile or () for name in given.split(",")) or tuple(PROFILES)
    max_pairs = ns.max_pairs or sequential.MAX_PAIRS
    Design(FINE_EFFECT, max_pairs=max_pairs)  # its ValueError names the limits
    return Options(
        chosen,
        ns.baselines,
        ns.levels or LEVELS,
        ns.draws,
        max_pairs,
        ns.seed,
        min(1000, ns.draws),
        min(ROW_DRAWS, ns.draws),
    )


def run(ns: argparse.Namespace, tiers: Callable[[], Mapping[str, str]] | None = None) -> int:
    """``tiers``: collects each scenario's tier, for the false alarms per run of each tier (called
    once the options are known good: collecting the suite takes seconds)."""
    try:
        chosen = options(ns)
        for name in chosen.profiles:
            noise_of(name)
        if not chosen.baselines.is_dir():
            raise ValueError(f"--baselines {chosen.baselines}: no such folder (the baselines/ of a checkout)")
    except ValueError as exc:
        print(f"perfsuite selftest --simulate: {exc}", file=sys.stderr)
        return 2
    chosen = dataclasses.replace(chosen, tiers=dict(tiers()) if tiers is not None else {})
    started = time.perf_counter()
    try:
        for line in report(chosen):
            print(line, flush=True)
    except BaselineError as exc:  # a row's model needs its file: a broken one is named, not skipped
        print(f"perfsuite selftest --simulate: {exc}", file=sys.stderr)
        return 2
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


def report(chosen: Options) -> Iterator[str]:
    yield (
        f"perfsuite selftest --simulate: {chosen.draws:,} modelled runs a level, the first {chosen.check:,} also judged "
        "by the gate's own code (judging.judge, the session's confirmation) or the A/B's (abtest.run_ab); "
        "95% Wilson intervals"
    )
    for name in chosen.profiles:
        noise = noise_of(name)
        profile = hardware(noise)
        yield ""
        yield from components(noise, profile)
        yield from levels_table(noise, profile, chosen)
        yield from ab_tables(noise, profile, chosen)
        yield from observed(noise, profile, chosen)
        yield from detectable_table(noise, profile, chosen)
        yield from false_alarms_table(noise, profile, chosen)


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
    yield (
        f"  a typical row: {row.steps} steps a launch, baseline of {row.baseline_launches} launch(es), tolerance "
        f"{row.tolerance:.1%}"
    )
    yield f"  {'slowdown':>8}  {'throughput':>10}  {'gate fails':<26}gate, own code"
    for level in chosen.levels:
        s = level / 100
        modelled = model.gate_verdicts(gate, row, rules, s) == model.REGRESSION
        real = realgate.gate_verdicts(gate, row, profile, rules.confirm, s, chosen.check) == model.REGRESSION
        agree = "agrees" if rate(real).overlaps(rate(modelled)) else "DISAGREES"
        yield f"  {level:>7g}%  {pct(-s / (1 + s)):>10}  {rate(modelled).show():<26}{rate(real).show()} {agree}"


def ab_tables(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    """The sequential A/B of the typical row at the profile's minimum effect (checked against
    ``abtest.run_ab``), then what a 1% minimum effect costs, at the chosen most pairs and more."""
    row = typical_row(noise, profile)
    first = Design(profile.min_effect, max_pairs=chosen.max_pairs)
    yield (
        f"  sequential A/B (ab-rev, --perf-ab) of the typical row, a pair's loss spreading "
        f"{math.sqrt(2) * row.launch_mean_cv:.2%}: alpha {first.alpha:.0%}, beta {first.beta:.0%}, "
        f"first look at {first.first_look} pairs; {chosen.draws:,} A/Bs a level"
    )
    rng = np.random.default_rng(chosen.seed)
    yield from ab_block(row, first, "the profile's", rng, chosen.draws, chosen.check)
    fine = min(chosen.draws, FINE_DRAWS)
    for most in sorted({chosen.max_pairs, max(chosen.max_pairs, FINE_PAIRS)}):
        note = f"what 1% costs; {fine:,} A/Bs a level"
        yield from ab_block(row, Design(FINE_EFFECT, max_pairs=most), note, rng, fine, 0)


def ab_block(row: Row, design: Design, note: str, rng: np.random.Generator, draws: int, check: int) -> Iterator[str]:
    """One design on one row at 0%, half the minimum effect and the minimum effect: P(regression),
    P(undecided) and the pairs spent; the first ``check`` draws also through ``abtest.run_ab``."""
    paired = model.pair_draws(row, design.max_pairs, rng, draws)
    yield f"    minimum effect {share(design.min_effect)} ({note}), at most {design.max_pairs} pairs:"
    own = "abtest.run_ab, draw for draw" if check else ""
    yield f"      {'slowdown':>8}  {'throughput':>10}  {'regression':<26}{'undecided':<26}{'pairs: mean  p95':>16}  {own}".rstrip()
    for s in ab_levels(design):
        codes, spent = model.sequential_verdicts(paired, design, s)
        caught, undecided = rate(codes == sequential.REGRESSION), rate(codes == sequential.UNDECIDED)
        line = (
            f"      {share(s):>8}  {pct(-s / (1 + s)):>10}  {caught.show():<26}{undecided.show():<26}"
            f"{spent.mean():>11.2f}  {np.percentile(spent, 95):>3.0f}  {own_code(paired, design, s, codes, spent, check)}"
        )
        yield line.rstrip()


def own_code(
    paired: model.PairDraws,
    design: Design,
    slowdown: float,
    codes: NDArray[np.int64],
    spent: NDArray[np.int64],
    check: int,
) -> str:
    """Whether the first ``check`` draws, each a whole ``abtest.run_ab``, end as the vectorised
    model says: the same verdict after the same number of pairs ("" when none are checked)."""
    if not check:
        return ""
    real, real_spent = realgate.sequential_verdicts(paired, design, slowdown, check)
    differ = int(np.count_nonzero((real != codes[:check]) | (real_spent != spent[:check])))
    return f"DIFFERS in {differ} of {check:,}" if differ else f"same verdict and pairs in {check:,} of {check:,}"


def ab_levels(design: Design) -> tuple[float, float, float]:
    """The slowdowns an A/B design is shown at: none, half its minimum effect, its minimum effect."""
    return 0.0, design.min_effect / 2, design.min_effect


def rows_for(noise: ProfileNoise, profile: HardwareProfile, baselines: Path) -> Callable[[trials.Trials], Row]:
    """Each trial's row from its committed baseline (the typical row where there is none)."""
    store = BaselineStore(baselines, noise.profile)

    def row(t: trials.Trials) -> Row:
        found = store.get(t.scenario.split(".")[0], t.scenario)
        metric = primary_of(found) if found is not None else None
        return row_of(found, metric, profile, noise) if found is not None and metric else typical_row(noise, profile)

    return row


def observed(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    mine = [t for t in chosen.observed if t.profile == noise.profile]
    if not mine:
        return
    rows = rows_for(noise, profile, chosen.baselines)
    found = trials.simulate(mine, rows, model.Rules.of(profile), chosen.histories, chosen.seed)
    yield (
        f"  committed trials against the model ({chosen.histories:,} simulated histories; each row's own baseline; "
        "ab: the fixed-n A/B those trials ran, not the sequential one):"
    )
    for s in found:
        t = s.trials
        what = f"{t.mode} {t.scenario} " + (f"(fixed, {t.pairs} pairs)" if t.mode == "ab" else f"[{t.session}]")
        side = ">=" if t.failed >= s.failed.mean() else "<="
        tail = s.tail()
        yield (
            f"    {what:<46}{t.level:>4.0%}: {t.failed}/{t.trials} failed; model {s.failed.mean() / t.trials:6.1%} a "
            f"trial, P({side}{t.failed} of {t.trials}) = {probability(tail, chosen.histories)}: {verdict(tail)}"
        )
    for mode, label in (("gate", "gate"), ("ab", "fixed-n ab")):
        yield from pooled_false_alarms(label, [s for s in found if s.trials.mode == mode], chosen.histories)


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
    return f"{share(slowdown)} ({pct(-slowdown / (1 + slowdown))})"


def committed_rows(noise: ProfileNoise, profile: HardwareProfile, baselines: Path) -> Iterator[tuple[str, Row, float]]:
    """Each committed row judged by its primary metric, with its minimum effect."""
    store = BaselineStore(baselines, noise.profile)
    for group in store.groups():
        entries = store.group(group)
        for scenario, entry in sorted(entries.items()):
            metric = primary_of(entry)
            if entry.expected == "ok" and metric and float(entry.metrics[metric].get("mean") or 0):
                yield scenario, row_of(entry, metric, profile, noise), min_effect_of(entry, profile)[0]


def detectable_table(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    rows = list(committed_rows(noise, profile, chosen.baselines))
    if not rows:
        yield f"  no committed baselines under {chosen.baselines / noise.profile}"
        return
    rules = model.Rules.of(profile)
    yield (
        f"  each row from {chosen.baselines / noise.profile}: the sequential A/B at most {chosen.max_pairs} pairs "
        f"({chosen.row_draws:,} A/Bs a level) against m, the row's own minimum effect else the profile's, at 0, m/2 "
        "and m; the smallest slowdown caught 9 times in 10 (throughput change)"
    )
    yield (
        f"    {'scenario':<40}{'step CV':>8}{'launch':>8}{'tol':>7}{'m':>6}{'regression at 0, m/2, m':>25}"
        f"{'undecided at 0, m/2, m':>25}{'mean pairs':>16}{'p95':>10}  {'gate':<16}  A/B, mean pairs"
    )
    for scenario, row, effect in rows:
        design = Design(effect, max_pairs=chosen.max_pairs)
        paired = model.pair_draws(row, design.max_pairs, np.random.default_rng(chosen.seed), chosen.row_draws)
        found = [model.sequential_verdicts(paired, design, s) for s in ab_levels(design)]
        caught = "".join(f"{np.mean(codes == sequential.REGRESSION):>8.1%}" for codes, _ in found)
        open_ = "".join(f"{np.mean(codes == sequential.UNDECIDED):>8.1%}" for codes, _ in found)
        mean = "".join(f"{spent.mean():>5.1f}" for _, spent in found)
        p95 = "".join(f"{np.percentile(spent, 95):>3.0f}" for _, spent in found)
        ab = ab_detectable(row, design, chosen.row_draws, chosen.seed)
        said = f"{show(ab.slowdown)}, {ab.mean_pairs:.1f}" if ab is not None else show(None)
        yield (
            f"    {scenario:<40}{row.step_cv:8.1%}{row.launch_cv:8.2%}{row.tolerance:7.1%}{share(effect):>6}"
            f" {caught} {open_} {mean} {p95}  {show(detectable(row, rules)):<16}  {said}"
        )


def false_alarms_table(noise: ProfileNoise, profile: HardwareProfile, chosen: Options) -> Iterator[str]:
    """Per tier, the chance an unchanged run of its committed rows fails at least one of them, with each
    row at its own tolerance and with the family's floor the gate adds (``judging.family_tolerances``),
    and what that floor costs: the median row's smallest slowdown caught 9 times in 10, both ways."""
    rows = [(scenario, row) for scenario, row, _ in committed_rows(noise, profile, chosen.baselines)]
    if not rows:
        return
    draws = min(family.DRAWS, chosen.draws)
    yield (
        f"  false alarms per run of each tier's committed rows ({draws:,} unchanged runs; every row of a run in its "
        f"session, its baselines in theirs; target {family.TARGET:.0%}): at least one false alarm with each row at "
        "its own tolerance, then with the family's floor (Bonferroni over the run's rows, as the gate judges), "
        "Bonferroni's bound on the latter, and the median row's smallest slowdown caught 9 times in 10, both ways"
    )
    if not chosen.tiers:
        yield "    (the suite was not collected, so its tiers are unknown: every committed row as one run)"
    yield f"    {'tier':<9}{'rows':>5}  {'own tolerances':<24}{'family floor':<24}{'bound':>7}  {'caught: own -> family':<24}"
    for tier in TIERS if chosen.tiers else ("every",):
        allowed = tiers_up_to(tier) if chosen.tiers else frozenset()
        chosen_rows = [(name, row) for name, row in rows if not chosen.tiers or chosen.tiers.get(name) in allowed]
        if not chosen_rows:
            continue
        alone = model.Rules.of(profile)
        together = model.Rules.of(profile, family_rows=len(chosen_rows))
        own = family.run_false_alarms(chosen_rows, alone, draws, chosen.seed)
        held = family.run_false_alarms(chosen_rows, together, draws, chosen.seed)
        over = "  OVER TARGET" if held.figure > family.TARGET else ""
        cost = f"{_median_caught(chosen_rows, alone)} -> {_median_caught(chosen_rows, together)}"
        yield (
            f"    {tier:<9}{len(chosen_rows):>5}  {own.joint.show():<24}{held.joint.show():<24}"
            f"{family.percent(held.bound):>7}  {cost:<24}{over}"
        )


def _median_caught(rows: Sequence[tuple[str, Row]], rules: model.Rules) -> str:
    found = [detectable(row, rules, 2000) for _, row in rows]
    caught = [x for x in found if x is not None]
    return share(float(np.median(caught))) if caught else "none"


__all__ = ["LEVELS", "Options", "false_alarms_table", "options", "report", "run"]
