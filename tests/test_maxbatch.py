"""--perf-find-max-batch: the search with fake trials, and once end to end with
real OOMs on a small-budget cpu profile."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from conftest import CPU_PROFILE

from perfsuite import ModelSpec, Scenario
from perfsuite.gate.session import Measurement, PerfSession
from perfsuite.launch import LaunchOutcome
from perfsuite.launch.base import RankFailure
from perfsuite.plugin.modes.batchsearch import MaxBatchResult, MaxBatchSearch, Trial, trial_runner

TINY = ModelSpec("bert", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)


def fake(fits_up_to: int, other: dict[int, str] | None = None) -> tuple[Callable[[int], Trial], list[int]]:
    """A trial function that trains up to ``fits_up_to`` and OOMs above; ``other``
    plants another status at given sizes. Also returns the sizes it was asked for."""
    asked: list[int] = []

    def run(size: int) -> Trial:
        asked.append(size)
        status = (other or {}).get(size) or ("ok" if size <= fits_up_to else "oom")
        return Trial(size, 2 * size, status)  # type: ignore[arg-type]

    return run, asked


def search(start: int, fits_up_to: int, limit: int = 4096, **kw: Any) -> tuple[MaxBatchResult, list[int]]:
    run, asked = fake(fits_up_to, **kw)
    scenario = Scenario("g", "s", TINY, micro_batch=start, global_batch=start, seq_len=32)
    return MaxBatchResult(scenario, start, limit, MaxBatchSearch(start, limit, run).run()), asked


def test_doubles_to_the_first_oom_then_bisects() -> None:
    result, asked = search(start=4, fits_up_to=12)
    assert asked == [4, 8, 16, 12, 14, 13]
    assert (result.largest_fitting, result.first_oom, result.outcome) == (12, 13, "boundary")
    assert result.headline() == "largest fitting micro-batch 12 (global batch 24), first OOM at 13; 6 trial(s)"


def test_boundary_just_above_the_start() -> None:
    result, asked = search(start=8, fits_up_to=8)
    assert asked == [8, 16, 12, 10, 9]
    assert (result.largest_fitting, result.first_oom) == (8, 9)


def test_limit_reached_without_oom_is_reported_as_fitting_up_to_it() -> None:
    result, asked = search(start=3, fits_up_to=10**6, limit=20)
    assert asked == [3, 6, 12, 20]
    assert (result.largest_fitting, result.first_oom, result.outcome) == (20, None, "limit")
    assert "fits up to the limit" in result.headline() and "--perf-max-batch-limit=20" in result.headline()


def test_oom_past_the_limit_is_bisected_below_it() -> None:
    result, asked = search(start=4, fits_up_to=10, limit=12)
    assert asked == [4, 8, 12, 10, 11]
    assert (result.largest_fitting, result.first_oom) == (10, 11)


def test_own_size_oom_searches_down() -> None:
    result, asked = search(start=16, fits_up_to=5)
    assert asked == [16, 8, 4, 6, 5]
    assert (result.largest_fitting, result.first_oom, result.outcome) == (5, 6, "boundary")


def test_even_one_oom_is_a_completed_search() -> None:
    result, asked = search(start=12, fits_up_to=0)
    assert asked == [12, 6, 3, 1]
    assert (result.largest_fitting, result.first_oom, result.outcome) == (None, 1, "none_fit")
    assert "even micro-batch 1 runs out of memory" in result.headline()


@pytest.mark.parametrize("status", ["crash", "timeout", "skipped", "invalid"])
def test_a_failure_other_than_oom_stops_the_search(status: str) -> None:
    result, asked = search(start=4, fits_up_to=12, other={16: status})
    assert asked == [4, 8, 16], "a crash must never be bisected as if it were an OOM"
    assert result.outcome == "stopped" and result.stopped_by is not None
    assert (result.largest_fitting, result.first_oom) == (8, None)
    assert result.headline() == f"search stopped: micro-batch 16 {status}; largest fitting so far 8; 3 trial(s)"


def test_result_json_and_table() -> None:
    result, _ = search(start=4, fits_up_to=5)
    doc = result.to_json()
    assert (doc["largest_fitting"], doc["first_oom"], doc["outcome"]) == (5, 6, "boundary")
    assert [t["micro_batch"] for t in doc["trials"]] == [4, 8, 6, 5]
    # The headline metric always (null here: the fake trials measure nothing); the others as measured.
    assert set(doc["trials"][0]) >= {"micro_batch", "global_batch", "status", "samples_per_s"}
    lines = result.lines()
    assert lines[0].startswith("g.s: largest fitting micro-batch 5")
    assert [line.split()[0] for line in lines[3:]] == ["4", "5", "6", "8"]  # sizes ascending


class FakeSession:
    """Records the scenarios a trial launches; every launch OOMs."""

    def __init__(self) -> None:
        self.launched: list[Scenario] = []

    def measure(self, scenario: Scenario) -> Measurement:
        self.launched.append(scenario)
        failure = RankFailure(0, "DefaultCPUAllocator: can't allocate memory", "(tail)")
        return Measurement((LaunchOutcome("oom", [], failure, wall_s=1.5),), None)


def test_trials_keep_grad_accum_and_let_validation_refuse_shapes() -> None:
    session = FakeSession()
    ddp = Scenario("g", "ddp", TINY, world_size=2, micro_batch=4, global_batch=24, seq_len=32)  # accum 3, dp 2
    trial = trial_runner(cast(PerfSession, session), ddp)(10)
    launched = session.launched[-1]
    assert (trial.status, trial.global_batch, trial.wall_s) == ("oom", 60, 1.5)
    assert (launched.micro_batch, launched.global_batch, launched.grad_accum) == (10, 60, 3)
    assert "can't allocate memory" in trial.message

    bad = trial_runner(cast(PerfSession, session), ddp)(0)
    assert bad.status == "invalid" and "micro_batch" in bad.message and len(session.launched) == 1


# -- end to end ------------------------------------------------------------------------
# 192 MiB per rank above the imported libraries: the plain-torch GPT below (no
# transformers import, so launches are cheap) trains at micro-batch 8 and runs
# out of memory at 16; measured boundary 12 (8 -> 16 -> 12 -> 14 -> 13).
SMALL_BUDGET = """
from perfsuite.core.profiles import HardwareProfile

def pytest_perfsuite_profiles():
    return [HardwareProfile("cpu-192m", "cpu", rank_memory_budget_mib=192, aliases=("cpu",), timeout_s=120)]
"""
MODULE = """
from perfsuite import Collective, ModelSpec, Relation, Scenario, parametrize, parametrize_relations

GPT = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=2048, max_positions=128)
# dp 2 x grad_accum 2; one measured step pair and no warmup keep each trial short.
TRAIN = Scenario("mb", "gpt", GPT, world_size=2, micro_batch=8, global_batch=32, seq_len=128,
                 warmup_steps=0, steps=2)
BUS = Collective("mb", "bus", world_size=2)
SMALLER = Scenario("mb", "smaller", GPT, world_size=2, micro_batch=1, global_batch=2, seq_len=128)

@parametrize([TRAIN, BUS])
def test_bench(perf, scenario):
    perf.check(scenario)

@parametrize_relations([Relation("peak_mem_mib", SMALLER, "<", TRAIN)])
def test_relations(perf, relation):
    perf.check_relation(relation)
"""


def test_finds_a_real_oom_boundary_and_writes_no_baseline(project: pytest.Pytester) -> None:
    project.makeconftest(SMALL_BUDGET)
    project.makepyfile(test_bench=textwrap.dedent(MODULE))
    out = project.path / "r.json"
    start = time.monotonic()
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rA", "--perf-profile=cpu-192m", "--perf-find-max-batch", f"--perf-json={out}"
    )
    elapsed = time.monotonic() - start
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*mb.bus: --perf-find-max-batch searches the micro-batch of train scenarios*"])
    result.stdout.fnmatch_lines(["*relations compare scenarios measured at their own batch*"])
    result.stdout.fnmatch_lines(["*perfsuite max batch (profile cpu-192m)*", "mb.gpt: largest fitting micro-batch *"])

    (found,) = json.loads(out.read_text())["max_batch"]
    trials = {t["micro_batch"]: t for t in found["trials"]}
    fit, oom = found["largest_fitting"], found["first_oom"]
    assert found["outcome"] == "boundary" and oom == fit + 1 and 2 <= fit < 64, found
    assert trials[fit]["status"] == "ok" and trials[fit]["samples_per_s"]["n"] == 2
    assert trials[fit]["peak_mem_mib"] > 0 and trials[fit]["global_batch"] == fit * 2 * 2
    assert trials[oom]["status"] == "oom" and "allocate memory" in trials[oom]["message"]
    assert not any((project.path / "baselines").iterdir()), "no baseline may be written in this mode"
    print(f"max-batch e2e: {len(trials)} trials, {elapsed:.0f}s")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--perf-find-max-batch", "--perf-update-baselines"], "*--perf-find-max-batch*--perf-update-baselines*"),
        (["--perf-max-batch-limit=64"], "*--perf-max-batch-limit only apply with --perf-find-max-batch*"),
        (["--perf-find-max-batch", "--perf-max-batch-start=0"], "*--perf-max-batch-start must be between 1*"),
    ],
)
def test_bad_max_batch_flags_are_usage_errors(pytester: pytest.Pytester, flags: list[str], message: str) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, *flags)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
