"""Real sequential A/B trials (scripts/ab_trials.sh) beside selftest --simulate's model of the same row.

Reads OUT/level-<L>-trial-<i>.json, counts verdicts and pairs per level, measures how much a pair's
loss spread in the trials, and asks the model two things: what it predicts for this row (its
committed cpu baseline's spread) and how likely the observed counts are under it (a binomial tail;
under 5% the model is rejected). It also runs the model with the spread the trials measured.
    python scripts/ab_trials_vs_model.py build/ab-trials [SCENARIO] [--baselines DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from perfsuite.core.profiles import CPU
from perfsuite.judge.sequential import DECISIONS, Design
from perfsuite.judge.simulate import model
from perfsuite.judge.simulate.noise import noise_of, primary_of, row_of
from perfsuite.store.baselines import BaselineStore

DRAWS = 100_000


def trials(folder: Path) -> dict[float, list[dict[str, Any]]]:
    found: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("level-*-trial-*.json")):
        level = float(re.match(r"level-([\d.]+)-trial", path.name).group(1))  # type: ignore[union-attr]
        found[level] += json.loads(path.read_text())["ab"]
    return found


def modelled(row: model.Row, design: Design, level: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    draws = model.pair_draws(row, design.max_pairs, np.random.default_rng(seed), DRAWS)
    return model.sequential_verdicts(draws, design, level / 100)


def tail(observed: int, trials: int, p: float) -> float:
    """P(a count at least as far from the model's expectation as the one seen), one-sided."""
    if observed >= trials * p:
        return float(stats.binom.sf(observed - 1, trials, p))
    return float(stats.binom.cdf(observed, trials, p))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("scenario", nargs="?", default="parallel_3d.tp1_pp1")
    parser.add_argument("--baselines", type=Path, default=Path("baselines"))
    ns = parser.parse_args()
    found = trials(ns.folder)
    entry = BaselineStore(ns.baselines, "cpu").get(ns.scenario.split(".")[0], ns.scenario)
    if entry is None:
        raise SystemExit(f"{ns.scenario}: no cpu baseline under {ns.baselines}: the model needs its stored spread")
    row = row_of(entry, primary_of(entry) or "samples_per_s", CPU, noise_of("cpu"))
    design = Design(CPU.min_effect)
    losses = [r["headline"]["losses"] for rs in found.values() for r in rs if r.get("headline")]
    # A pair's spread within each trial (the level shifts the mean, not the spread), pooled.
    within = [statistics.variance(x) * (len(x) - 1) for x in losses if len(x) > 1]
    measured = math.sqrt(sum(within) / sum(len(x) - 1 for x in losses if len(x) > 1))
    spreads = sorted(statistics.stdev(x) for x in losses if len(x) > 2)
    typical = statistics.median(spreads)
    modelled_pair = math.sqrt(2) * row.launch_mean_cv
    print(
        f"{ns.scenario}: {sum(len(x) for x in losses)} pairs in {len(losses)} trials; a pair's loss spread "
        f"{measured:.2%} measured, {modelled_pair:.2%} modelled (launch CV {row.launch_cv:.2%}, step CV "
        f"{row.step_cv:.1%} over {row.steps} steps); per trial (3+ pairs) {spreads[0]:.1%} to {spreads[-1]:.1%}, "
        f"median {typical:.2%}"
    )

    def with_spread(pair_sd: float) -> model.Row:
        launch = math.sqrt(max(0.0, pair_sd**2 / 2 - row.step_cv**2 / row.steps))
        return model.Row(row.step_cv, launch, row.session_cv, row.steps, row.baseline_launches, row.tolerance)

    for level, results in sorted(found.items()):
        verdicts = [r["verdict"] for r in results]
        pairs = [r["pairs"] for r in results]
        n, caught, undecided = len(results), verdicts.count("regression"), verdicts.count("undecided")
        print(
            f"level {level:g}%: regression {caught}/{n}, pass {verdicts.count('pass')}, undecided {undecided}, "
            f"other {n - caught - undecided - verdicts.count('pass')}; pairs mean {statistics.fmean(pairs):.2f} "
            f"(most {max(pairs)}); slowdown read {statistics.median(r['headline']['slowdown'] for r in results):+.1%} median"
        )
        variants = (
            ("the row's committed spread", row),
            ("the trials' median spread", with_spread(typical)),
            ("the trials' pooled spread", with_spread(measured)),
        )
        for label, which in variants:
            code, spent = modelled(which, design, level)
            p_reg = float(np.mean(code == DECISIONS.index("regression")))
            p_und = float(np.mean(code == DECISIONS.index("undecided")))
            print(
                f"  model, {label}: regression {p_reg:.1%}, undecided {p_und:.2%}, pairs mean {spent.mean():.2f}; "
                f"P(as far as {caught}/{n} regressions) = {tail(caught, n, p_reg):.3g}, "
                f"P(as far as {undecided}/{n} undecided) = {tail(undecided, n, p_und):.3g}"
            )


if __name__ == "__main__":
    main()
