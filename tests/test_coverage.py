"""A gate that cannot judge must say so (issue 26): the coverage line and its
verdict, quarantine one scenario at a time (with expiry), and contention
handled by waiting for a quiet host and measuring again."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import CPU_PROFILE, TINY, TINY_SHAPE

from perfsuite.core.engines import MissingPackage
from perfsuite.judge.contention import Contention, Quiet, wait_for_quiet
from perfsuite.judge.coverage import Outcome, coverage_of, kinds_judged
from perfsuite.plugin import exitstatus as gate
from perfsuite.store import quarantine
from tests.test_contention import busy
from tests.test_verdicts import SCENARIO, SLOW, STEADY, FakeLauncher, record, session

TODAY = date(2026, 11, 26)


def test_the_line_counts_judged_unjudged_quarantined_and_not_for_this_machine() -> None:
    found = coverage_of(
        [
            Outcome("a.pass", "pass"),
            Outcome("a.reg", "regression"),
            Outcome("a.rec", "recorded"),
            Outcome(
                "b.busy",
                "unreliable",
                "measured under contention (foreign load: other processes kept 0.98 of vm's 2 CPU cores busy "
                "(limit 0.25)), so not judged a regression",
            ),
            Outcome("b.new", "no_baseline"),
            Outcome("c.big", "skipped", "needs 4 GPUs, 1 node(s) here have 1"),
            Outcome("d.flaky", "regression", quarantined=True),
        ]
    )
    assert found.line() == (
        "judged 3 of 7 selected scenario(s); not judged: 1 unreliable (foreign load: other processes kept 0.98 of "
        "vm's 2 CPU cores busy (limit 0.25)), 1 no baseline; quarantined (run, not gating): 1; not for this machine: 1; "
        "judged: memory 0, timing 0 of 7"
    )
    assert not found.ok
    fixes = "\n".join(found.fixes())
    assert "unreliable: b.busy: rerun on a quiet runner" in fixes
    assert "no_baseline: b.new: record baselines: python -m perfsuite bootstrap" in fixes
    assert found.to_json()["skipped"] == {"c.big": "needs 4 GPUs, 1 node(s) here have 1"}


def test_the_line_counts_rows_by_what_judged_them_work_memory_and_timing() -> None:
    # A runner whose processor has no timing baselines still judges work and memory exactly.
    assert kinds_judged(["samples_per_s", "peak_mem_mib"], "pass") == (True, True)
    assert kinds_judged(["peak_mem_mib"], "other_machine") == (False, True)  # timing from another processor
    assert kinds_judged(["samples_per_s"], "regression") == (True, False)
    assert kinds_judged([], "expected_oom") == (False, True) and kinds_judged([], "error") == (False, False)
    found = coverage_of(
        [
            Outcome("a.same", "pass", work="unchanged", timing=True, memory=True),
            Outcome("a.elsewhere", "other_machine", work="unchanged", memory=True),
            Outcome("a.oom", "expected_oom", memory=True),
            Outcome("a.new", "no_baseline", work="not_judged"),
            Outcome("a.held", "regression", quarantined=True, work="changed", timing=True, memory=True),
        ]
    )
    assert found.line().endswith("; judged: work 2, memory 3, timing 1 of 5")
    assert found.to_json()["timing_judged"] == ["a.same"] and found.to_json()["memory_judged"] == [
        "a.same",
        "a.elsewhere",
        "a.oom",
    ]


def test_a_run_is_green_only_when_it_judged_something_and_left_nothing_unjudged() -> None:
    assert coverage_of([Outcome("a", "pass"), Outcome("b", "skipped", "needs 8 GPUs")]).ok
    assert coverage_of([Outcome("a", "expected_oom"), Outcome("b", "regression", quarantined=True)]).ok
    assert not coverage_of([Outcome("a", "regression", quarantined=True)]).ok  # judged nothing
    assert "nothing was judged" in coverage_of([Outcome("a", "pass", quarantined=True)]).fixes()[0]
    assert not coverage_of([Outcome("a", "pass"), Outcome("b", "unreliable")]).ok


MEGATRON = MissingPackage("megatron.core", "megatron")


def test_rows_whose_engine_is_not_installed_are_counted_apart_and_grouped_by_the_extra() -> None:
    found = coverage_of(
        [
            Outcome("a.pass", "pass"),
            Outcome("c.big", "skipped", "needs 4 GPUs, 1 node(s) here have 1"),
            Outcome("p.mcore1", "skipped", MEGATRON.describe(), missing=MEGATRON),
            Outcome(
                "p.zero", "skipped", "deepspeed is not installed", missing=MissingPackage("deepspeed", "deepspeed")
            ),
            Outcome("p.mcore2", "skipped", MEGATRON.describe(), missing=MEGATRON),
            Outcome("p.own", "skipped", "their_engine is not installed", missing=MissingPackage("their_engine")),
        ]
    )
    assert (
        found.line()
        == "judged 1 of 6 selected scenario(s); not for this machine: 1; engine not installed: 4; judged: memory 0, timing 0 of 6"
    )
    assert found.ok, "a skip stays a skip: a runner need not install every engine"
    assert found.notes() == [
        "not installed: 2 rows need perfsuite[megatron] (pip install 'perfsuite[megatron]'): p.mcore1, p.mcore2",
        "not installed: 1 row needs perfsuite[deepspeed] (pip install 'perfsuite[deepspeed]'): p.zero",
        "not installed: 1 row needs their_engine (install their_engine): p.own",
    ]
    document = found.to_json()
    assert document["not_installed"][0] == {
        "needs": "perfsuite[megatron]",
        "install": "pip install 'perfsuite[megatron]'",
        "scenarios": ["p.mcore1", "p.mcore2"],
    }
    assert set(document["skipped"]) == {"c.big", "p.mcore1", "p.zero", "p.mcore2", "p.own"}  # every skip, as before


#: A team's engine whose package is not installed here, installed by a real extra of perfsuite's.
PHANTOM = f"""
from perfsuite import EngineSpec, ModelSpec, Scenario, parametrize, register_engine

register_engine(EngineSpec("phantom", "perfsuite_phantom_engine:Strategy", extra="megatron",
                           requires=("perfsuite_phantom_engine.core",)))
TINY = {TINY}
PHANTOM_ROWS = [
    Scenario("phantom", "a", TINY, {TINY_SHAPE}, strategy="phantom"),
    Scenario("phantom", "b", TINY, {TINY_SHAPE}, strategy="phantom"),
]
"""
#: Those rows and one that runs.
BENCH = f"""{PHANTOM}
@parametrize([*PHANTOM_ROWS, Scenario("tiny", "fp32", TINY, {TINY_SHAPE})])
def test_bench(perf, scenario):
    perf.check(scenario)
"""
INSTALL = "pip install 'perfsuite[megatron]'"


def test_a_run_names_the_extra_that_would_judge_rows_skipped_for_a_missing_engine(pytester: pytest.Pytester) -> None:
    pytester.mkdir("baselines")
    pytester.makepyfile(test_bench=BENCH)
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-rs",
        CPU_PROFILE,
        "--perf-update-baselines",
        "--perf-op-profiles=off",
        f"--perf-json={out}",
    )
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*perfsuite coverage: judged 1 of 3 selected scenario(s); engine not installed: 2*",
            f"not installed: 2 rows need perfsuite[megatron] ({INSTALL}): phantom.a, phantom.b",
            "SKIPPED*phantom.a: perfsuite_phantom_engine.core is not installed; install it with: pip install*",
        ]
    )
    reason = f"phantom.a: perfsuite_phantom_engine.core is not installed; install it with: {INSTALL}"
    assert any(line.endswith(reason) for line in result.outlines), "the skip keeps its precise reason"
    assert result.ret == pytest.ExitCode.OK, "skipped rows do not fail a run that judged something"
    coverage = json.loads(out.read_text())["coverage"]
    assert coverage["not_installed"] == [
        {"needs": "perfsuite[megatron]", "install": INSTALL, "scenarios": ["phantom.a", "phantom.b"]}
    ]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


ENTRY = '[[scenario]]\nid = "g.s"\nreason = "flaky allgather (#12)"\nowner = "alice"\nexpires = 2026-12-31\n'


def test_a_quarantine_file_lists_ids_with_reason_owner_and_expiry(tmp_path: Path) -> None:
    entries = quarantine.load(write(tmp_path / "quarantine.toml", ENTRY))
    assert entries["g.s"].describe() == "quarantined until 2026-12-31 by alice: flaky allgather (#12)"
    assert quarantine.expired(entries, TODAY) == []
    (line,) = quarantine.expired(entries, date(2027, 1, 1))
    assert line.startswith("quarantine of g.s expired on 2026-12-31 (owner alice")
    assert quarantine.load(tmp_path / "absent.toml") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (ENTRY.replace('owner = "alice"\n', ""), "field 'owner' must be a non-empty string"),
        (ENTRY.replace("2026-12-31", '"next week"'), "field 'expires' must be a date such as 2026-12-31"),
        (ENTRY + 'why = "x"\n', "unknown field(s) ['why']"),
        (ENTRY + ENTRY, "scenario 'g.s' is listed twice"),
        ("[scenario]\nid = 1\n", "'scenario' must be an array of tables"),
        ("id = [", "not readable TOML"),
    ],
)
def test_a_bad_quarantine_file_names_the_file_and_the_field(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path / "quarantine.toml", text)
    with pytest.raises(quarantine.QuarantineError, match=r"quarantine\.toml") as raised:
        quarantine.load(path)
    assert says in str(raised.value)


def fake_config(allow: bool = False, entries: dict[str, quarantine.Entry] | None = None) -> Any:
    stash = {gate.QUARANTINE_KEY: entries or {}}
    return SimpleNamespace(getoption=lambda flag: allow if flag == gate.ALLOW_FLAG else None, stash=stash)


def test_an_unjudged_run_fails_unless_allowed_and_an_expired_quarantine_always_fails(tmp_path: Path) -> None:
    unjudged = coverage_of([Outcome("a", "pass"), Outcome("b", "no_baseline")])
    (why, fix) = gate.problems(fake_config(), unjudged, TODAY)
    assert why.startswith("not judged, so this run fails (--perf-allow-unjudged opts out): judged 1 of 2")
    assert fix.startswith("no_baseline: b: record baselines")
    assert gate.problems(fake_config(allow=True), unjudged, TODAY) == []
    entries = quarantine.load(write(tmp_path / "q.toml", ENTRY))
    judged = coverage_of([Outcome("a", "pass")])
    assert gate.problems(fake_config(True, entries), judged, TODAY) == []
    (expired,) = gate.problems(fake_config(True, entries), judged, date(2027, 1, 1))
    assert "quarantine of g.s expired on 2026-12-31" in expired


class Waits:
    """A quiet-host wait that answers from a script and counts what it was asked."""

    def __init__(self, *answers: bool, waited_s: float = 5.0) -> None:
        self.answers, self.waited_s, self.calls = list(answers), waited_s, []  # type: list[float]

    def __call__(self, foreign: float, steal: float, timeout_s: float) -> Quiet:
        self.calls.append(timeout_s)
        return Quiet(self.answers.pop(0), self.waited_s, Contention(0.9, 0.0, "a", 2))


class BusyThenQuiet(FakeLauncher):
    """Launches under load until ``busy_launches`` have run, then on a quiet host."""

    def __init__(self, launches: list[list[float]], busy_launches: int) -> None:
        super().__init__(launches, health=busy())
        self.busy_launches = busy_launches

    def run(self, job: Any) -> Any:
        self.health = busy() if self.count < self.busy_launches else {}
        return super().run(job)


def test_a_contended_regression_waits_for_a_quiet_host_and_is_judged_on_a_fresh_measurement(tmp_path: Path) -> None:
    record(tmp_path, STEADY)
    perf, _ = session(tmp_path, [], confirm=0)
    perf.launcher = BusyThenQuiet([SLOW, SLOW], busy_launches=1)  # type: ignore[misc]
    perf.wait_for_quiet = waits = Waits(True)  # type: ignore[method-assign]
    result = perf.run(SCENARIO)
    assert result.verdict == "regression", result.judgement.message
    assert [a["verdict"] for a in result.attempts] == ["unreliable", "regression"]
    assert (
        "measured again after the host went quiet; try 1: foreign load: other processes kept 0.50"
        in result.judgement.message
    )
    assert len(result.judgement.notes_of("contention")) == 1
    assert waits.calls == [60.0] and perf.waited_s == 5.0


def test_a_host_that_stays_busy_gives_unreliable_naming_every_try(tmp_path: Path) -> None:
    record(tmp_path, STEADY)
    perf, _ = session(tmp_path, [], confirm=0, contention_retries=2)
    perf.launcher = FakeLauncher([SLOW, SLOW, SLOW], health=busy())  # type: ignore[misc]
    perf.wait_for_quiet = Waits(True, True)  # type: ignore[method-assign]
    result = perf.run(SCENARIO)
    assert result.verdict == "unreliable" and len(result.attempts) == 3
    assert "all 3 measurement(s) contended (--perf-contention-retries 2)" in result.judgement.message
    assert (
        "try 1: foreign load: other processes kept 0.50" in result.judgement.message
        and "try 3:" in result.judgement.message
    )
    assert len(result.judgement.notes_of("contention")) == 2  # the doubt, then the tries


def test_waiting_is_bounded_per_scenario_and_per_session(tmp_path: Path) -> None:
    record(tmp_path, STEADY)
    perf, _ = session(tmp_path, [], confirm=0, contention_wait_s=30.0, contention_budget_s=40.0)
    perf.launcher = FakeLauncher([SLOW] * 4, health=busy())  # type: ignore[misc]
    perf.wait_for_quiet = waits = Waits(True, True, waited_s=25.0)  # type: ignore[method-assign]
    first = perf.run(SCENARIO)
    # 30 s offered (the per-scenario bound), 25 used; then only the 15 s the session has left.
    assert waits.calls == [30.0, 15.0] and perf.waited_s == 50.0
    assert first.verdict == "unreliable"
    perf.results.clear()
    again = perf.run(SCENARIO)
    assert "the session's wait budget for a quiet host is spent" in again.judgement.message
    assert waits.calls == [30.0, 15.0]  # nothing left to wait


def test_a_host_that_never_goes_quiet_ends_the_wait_at_its_bound() -> None:
    loaded = Contention(1.5, 0.0, "a", 2)
    ended = wait_for_quiet(0.25, 0.1, 0.05, sample=lambda: loaded)
    assert not ended.quiet and ended.last == loaded and ended.waited_s >= 0.05
    # Quiet means three quiet samples in a row: a lull between a neighbour's bursts is not enough.
    bursts = iter([Contention(x, 0.0, "a", 2) for x in (0.1, 0.9, 0.1, 0.1, 0.9, 0.1, 0.1, 0.1, 0.9)])
    taken: list[Contention] = []
    ended = wait_for_quiet(0.25, 0.1, 5, sample=lambda: taken.append(next(bursts)) or taken[-1])
    assert ended.quiet and len(taken) == 8


def test_no_workflow_turns_an_unjudged_run_green() -> None:
    root = Path(__file__).parents[1]
    workflows = sorted((root / ".github" / "workflows").glob("*.yml"))
    assert workflows
    for path in workflows:
        text = path.read_text()
        assert gate.ALLOW_FLAG not in text, path
        assert "continue-on-error" not in text and "|| true" not in text, path


def test_the_deprecated_flag_still_works_and_says_it_is_deprecated(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perf-profile=cpu", "--perf-fail-unreliable")
    result.assert_outcomes(passed=1)
    result.stderr.fnmatch_lines(["*DeprecatedOptionWarning: --perf-fail-unreliable is deprecated*"])


class QuietThenBusy(FakeLauncher):
    """The first launch on a quiet host, every later one under load."""

    def run(self, job: Any) -> Any:
        self.health = busy() if self.count >= 1 else {}
        return super().run(job)


def test_a_confirmation_spoilt_by_contention_is_not_called_noise(tmp_path: Path) -> None:
    record(tmp_path, STEADY)
    perf, _ = session(tmp_path, [], confirm=1, contention_retries=0)
    perf.launcher = QuietThenBusy([SLOW, SLOW])  # type: ignore[misc]
    result = perf.run(SCENARIO)
    assert [a["verdict"] for a in result.attempts] == ["regression", "unreliable"]
    assert result.verdict == "unreliable"
    assert "confirmation measurement 1 could not be judged, so neither is" in result.judgement.message
    assert "treated as noise" not in result.judgement.message
