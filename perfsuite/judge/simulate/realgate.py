"""The same draws judged by the gate's own code: ``judging.judge`` on the objects a session builds,
then the session's confirmation loop; the sequential A/B's: ``abtest.run_ab`` replaying each draw's
launches pair by pair; and ``abtest.compare`` for the old fixed-n A/B of the committed trials. Slow
(a scipy test per call), so only a few thousand draws come here, to check the vectorised model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfsuite.core.models import ModelSpec
from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.workloads import Scenario
from perfsuite.judge.abtest import RunOnce, run_ab
from perfsuite.judge.abtest import compare as ab_compare
from perfsuite.judge.compare import Judgement, check_metric
from perfsuite.judge.judging import judge
from perfsuite.judge.results import Measurement, OneLaunch
from perfsuite.judge.sequential import DECISIONS, Design
from perfsuite.judge.simulate.model import PASS, REGRESSION, UNRELIABLE, GateDraws, PairDraws, Summaries
from perfsuite.judge.simulate.noise import Row
from perfsuite.judge.stats import ScenarioMetrics, Summary
from perfsuite.launch import LaunchOutcome
from perfsuite.store.baselines import BaselineEntry

METRIC = "samples_per_s"
#: Any training row judges samples/s as its primary metric; its shape does not enter a verdict.
SCENARIO = Scenario(
    "simulated",
    "row",
    ModelSpec("bert", 1, 32, 2, 512, 32),
    world_size=1,
    micro_batch=2,
    global_batch=2,
    seq_len=16,
    steps=20,
)
#: Baseline and run on one machine, so no machine note and no cpu ``other_machine``.
FINGERPRINT: dict[str, Any] = {"gpus": [], "gpu_count": 0, "processor": {"model": "simulated"}}
CODES = {"pass": PASS, "improved": PASS, "regression": REGRESSION, "unreliable": UNRELIABLE}


def _measurement(mean: float, std: float, n: int) -> Measurement:
    metrics = ScenarioMetrics(
        values={METRIC: Summary(mean, std, n)}, step_time_median_s=0.0, step_time_p90_s=0.0, step_times_s=[]
    )
    return Measurement((LaunchOutcome("ok", ()),), metrics)


def _baseline(base: Summaries, i: int, tolerance: float) -> BaselineEntry:
    stored = {"mean": float(base.mean[i]), "std": float(base.std[i]), "n": base.n}
    return BaselineEntry("ok", {METRIC: stored}, {METRIC: tolerance}, FINGERPRINT)


def session_verdict(judged: Sequence[Judgement], confirm: int) -> str:
    """session.PerfSession._run: confirm a regression up to ``confirm`` times; the first
    confirmation that is no regression gives the verdict."""
    judgement = judged[0]
    for later in judged[1 : 1 + (confirm if judgement.verdict == "regression" else 0)]:
        judgement = later
        if judgement.verdict != "regression":
            break
    return judgement.verdict


def gate_verdicts(
    draws: GateDraws, row: Row, profile: HardwareProfile, confirm: int, slowdown: float, count: int
) -> NDArray[np.int64]:
    """The first ``count`` draws, each judged by ``judging.judge`` (lazily: a confirmation is judged
    only when the session would have measured it)."""
    attempts = draws.at(slowdown)
    found = []
    for i in range(count):
        baseline = _baseline(draws.base, i, row.tolerance)
        judged: list[Judgement] = []
        for attempt in attempts[: 1 + confirm]:
            measured = _measurement(float(attempt.mean[i]), float(attempt.std[i]), attempt.n)
            judged.append(judge(SCENARIO, measured, baseline, profile, check_metric, lambda: FINGERPRINT))
            if judged[-1].verdict != "regression":
                break
        found.append(CODES[session_verdict(judged, confirm)])
    return np.array(found, dtype=np.int64)


def fixed_ab_verdicts(draws: PairDraws, tolerance: float, slowdown: float, count: int) -> NDArray[np.bool_]:
    """The first ``count`` A/B trials of the old fixed-n design, each judged by ``abtest.compare``."""
    base, candidate = draws.at(slowdown)
    outcomes = [ab_compare(METRIC, list(base[i]), list(candidate[i]), tolerance).outcome for i in range(count)]
    return np.array([o == "regression" for o in outcomes])


def replay(base: Sequence[float], candidate: Sequence[float]) -> RunOnce:
    """A ``run_once`` that hands each side its next drawn launch, in whatever order ``run_ab`` asks."""
    queues = {"base": iter(base), "candidate": iter(candidate)}

    def run_once(env: str) -> OneLaunch:
        return OneLaunch("ok", {METRIC: float(next(queues[env]))})

    return run_once


def sequential_verdicts(
    draws: PairDraws, design: Design, slowdown: float, count: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The first ``count`` draws, each a whole ``abtest.run_ab`` (its ``Trial`` looking after every
    pair) on that draw's launches: the decision code (``sequential.DECISIONS``) and pairs spent."""
    base, candidate = draws.at(slowdown)
    codes, spent = [], []
    for i in range(count):
        found = run_ab(SCENARIO.id, (METRIC,), replay(base[i], candidate[i]), "base", "candidate", design, {})
        codes.append(DECISIONS.index(found.verdict))  # raises on any other verdict (error, unreliable)
        spent.append(found.pairs)
    return np.array(codes, dtype=np.int64), np.array(spent, dtype=np.int64)
