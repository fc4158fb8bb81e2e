"""The real plugin in a subprocess (pytester), real torchrun workers, 2 gloo ranks."""

from __future__ import annotations

import json
import os
import shlex
import sys
import textwrap
import time

import pytest
from conftest import CPU_PROFILE, FAKE_NVML, JUDGE_UNDER_CONTENTION, TINY_SHAPE, bench_module, leftover_workers

# A 3-step run of a tiny model swings widely in throughput on a busy 2-core
# machine; the tolerance is loose so only a planted 100x drop must fail.
ONE = f'Scenario("tiny", "fp32", TINY, {TINY_SHAPE}, tolerances={{"samples_per_s": 0.8}}),'


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The plugin in a subprocess, on the cpu profile unless ``args`` name one."""
    pin = [] if any(a.startswith("--perf-profile") for a in args) else [CPU_PROFILE]
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *pin, *args)


def baseline_path(pytester: pytest.Pytester, group: str = "tiny"):
    return pytester.path / "baselines" / "cpu" / f"{group}.json"


def test_no_baseline_skips_with_the_record_command_and_fails_the_run(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(ONE))
    result = run(project)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*perfsuite coverage: judged 0 of 1 selected scenario(s); not judged: 1 no baseline*",
            "not judged, so this run fails (--perf-allow-unjudged opts out)*",
            "no_baseline: tiny.fp32: record baselines: python -m perfsuite bootstrap*",
            "*no baseline in*tiny.json (not judged, fails the run)*--perf-update-baselines*",  # -rA's skip line, last
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_update_rerun_then_doctored_baseline_regresses(project: pytest.Pytester) -> None:
    project.makeconftest(JUDGE_UNDER_CONTENTION)
    project.makepyfile(test_bench=bench_module(ONE))
    run(project, "--perf-update-baselines").assert_outcomes(passed=1)
    path = baseline_path(project)
    recorded = path.read_bytes()

    rerun = run(project, f"--perf-json={project.path / 'r.json'}")
    rerun.assert_outcomes(passed=1)
    assert path.read_bytes() == recorded, "a normal run must never rewrite baselines"
    # The recording run may have been the slower one (cold caches): improved is a pass too.
    rerun.stdout.re_match_lines([r".*perfsuite summary \(profile cpu\).*", r"tiny\.fp32\s+ok.*(pass|improved)$"])
    # The run states its chance of a false alarm, from the model of the rows whose timing it judged.
    rerun.stdout.fnmatch_lines(["perfsuite false alarms: an unchanged run of these 1 timing-judged row fails *"])
    alarms = json.loads((project.path / "r.json").read_text())["false_alarms"]
    assert alarms["rows"] == ["tiny.fp32"] and 0 <= alarms["joint"] <= alarms["bound"] <= 1

    doc = json.loads(recorded)
    # 100x, not 10x: with the 80% tolerance a 10x baseline passed once, when the
    # rerun ran 2.2x faster than a cold recording run (-78% measured).
    doc["scenarios"]["tiny.fp32"]["metrics"]["samples_per_s"]["mean"] *= 100
    path.write_text(json.dumps(doc))
    doctored = run(project, f"--perf-json={project.path / 'd.json'}")
    doctored.assert_outcomes(failed=1)
    doctored.stdout.fnmatch_lines(["*tiny.fp32: regression: samples_per_s*vs baseline*higher is better*"])
    # The failure says how to run that row again, with the flags that decide its judgement, and how
    # to settle it; the command it prints, run as printed, reproduces the verdict.
    (failed,) = json.loads((project.path / "d.json").read_text())["results"]
    rerun = failed["repro"]["rerun"]
    assert rerun == "pytest 'test_bench.py::test_bench[tiny.fp32]' --perf-profile=cpu", rerun
    assert failed["repro"]["ab_rev"].startswith("python -m perfsuite ab-rev HEAD~1 'test_bench.py::test_bench[tiny")
    assert failed["repro"]["bisect"] is None  # the baseline was recorded outside any git checkout
    said = doctored.stdout.lines
    assert f"run it again: {rerun}" in said and f"settle it on this machine: {failed['repro']['ab_rev']}" in said
    again = run(project, *shlex.split(rerun)[1:])
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*tiny.fp32: regression: samples_per_s*vs baseline*higher is better*"])

    # The same 100x baseline recorded on another processor: its timing is not comparable here, and
    # the run stays green; memory is judged, and the message names both processors.
    here = doc["scenarios"]["tiny.fp32"]["fingerprint"]["processor"]
    other = {**here, "model": "Intel(R) Xeon(R) Platinum 8481C", "vendor": "GenuineIntel", "features": ["amx_bf16"]}
    doc["scenarios"]["tiny.fp32"]["fingerprint"]["processor"] = other
    path.write_text(json.dumps(doc))
    elsewhere = run(project, f"--perf-json={project.path / 'e.json'}")
    elsewhere.assert_outcomes(passed=1)
    assert "false_alarms" not in json.loads((project.path / "e.json").read_text()), "no timing judged, no figure"
    elsewhere.stdout.fnmatch_lines(
        [
            r"tiny.fp32*other_machine",
            "*perfsuite coverage: judged 1 of 1 selected scenario(s);"
            " timing not judged, baseline from another processor: 1*",
        ]
    )
    (result,) = json.loads((project.path / "e.json").read_text())["results"]
    assert "Platinum 8481C" in result["message"] and here["model"] in result["message"]
    assert [c["metric"] for c in result["checks"]] == ["peak_mem_mib", "model_state_bytes_per_rank"]
    assert elsewhere.ret == pytest.ExitCode.OK
    doc["scenarios"]["tiny.fp32"]["fingerprint"]["processor"] = here
    path.write_text(json.dumps(doc))

    # Quarantined, it still runs and is reported, but does not gate; a run that judged nothing else still fails.
    (path.parent / "quarantine.toml").write_text(
        '[[scenario]]\nid = "tiny.fp32"\nreason = "doctored"\nowner = "ci"\nexpires = 2099-01-01\n'
    )
    held = run(project, f"--perf-json={project.path / 'q.json'}")
    held.assert_outcomes(skipped=1)
    held.stdout.fnmatch_lines(
        [
            "*tiny.fp32: QUARANTINED, not gating (quarantined until 2099-01-01 by ci: doctored); "
            "regression: samples_per_s*"
        ]
    )
    coverage = json.loads((project.path / "q.json").read_text())["coverage"]
    assert coverage["quarantined"] == ["tiny.fp32"] and coverage["judged"] == []
    assert held.ret == pytest.ExitCode.TESTS_FAILED


def test_results_file_follows_the_contract(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(ONE))
    out = project.path / "results.json"
    allowed = run(project, f"--perf-json={out}", "--perf-allow-unjudged")
    allowed.assert_outcomes(skipped=1)
    assert allowed.ret == pytest.ExitCode.OK  # the explicit opt-out
    doc = json.loads(out.read_text())
    assert {"machine", "results", "coverage"} <= set(doc)
    assert doc["nodeids"] == {"tiny.fp32": "test_bench.py::test_bench[tiny.fp32]"}  # what ab-rev reruns
    assert doc["coverage"]["line"] == (
        "judged 0 of 1 selected scenario(s); not judged: 1 no baseline; judged: work 0, memory 0, timing 0 of 1"
    )
    assert doc["coverage"]["ok"] is False and doc["coverage"]["unjudged"] == {"no_baseline": ["tiny.fp32"]}
    (result,) = doc["results"]
    assert {"id", "group", "status", "config", "metrics", "baseline", "verdict"} <= set(result)
    assert result["status"] == "ok" and result["verdict"] == "no_baseline" and result["baseline"] is None
    config = result["config"]
    for key in ("model", "precision", "strategy", "world_size", "micro_batch", "global_batch", "seq_len", "steps"):
        assert key in config
    metrics = result["metrics"]
    assert set(metrics["samples_per_s"]) == {"mean", "std", "n"} and metrics["samples_per_s"]["n"] == 4
    assert set(metrics["step_time_s"]) == {"median", "p90"}
    assert metrics["tokens_per_s"] == pytest.approx(metrics["samples_per_s"]["mean"] * 32)
    assert metrics["peak_mem_mib"] > 0 and metrics["model_state_bytes_per_rank"] > 0
    assert isinstance(metrics["model_state_bytes_per_rank"], int) and isinstance(metrics["tokens_per_s"], float)
    assert result["config"]["kind"] == "train"
    assert doc["machine"]["runtime"]["torch"]
    # The step's work, counted though nothing could judge it yet (no counts recorded).
    work = result["work"]
    assert work["status"] == "not_judged" and "no recorded counts" in work["message"]
    assert work["count"]["ranks"] == 2 and work["count"]["steady"] and work["count"]["ops"]


OOM_CONFTEST = """
from perfsuite.core.profiles import HardwareProfile

def pytest_perfsuite_profiles():
    # 256 MiB per rank above the imported libraries: the tiny GPT fits, a
    # 44M-parameter one (700 MiB of weights, grads and Adam states) cannot.
    return [HardwareProfile("cpu-256m", "cpu", rank_memory_budget_mib=256, aliases=("cpu",))]
"""
BIG = 'ModelSpec("megatron_gpt", layers=4, hidden=512, heads=8, vocab=30522, max_positions=32)'


def test_expected_oom_passes_and_unexpected_outcomes_fail(project: pytest.Pytester) -> None:
    project.makeconftest(OOM_CONFTEST)
    project.makepyfile(
        test_bench=bench_module(
            f"""
            Scenario("mem", "big-expected", {BIG}, {TINY_SHAPE}, expect={{"cpu": "oom"}}),
            Scenario("mem", "big-unexpected", {BIG}, {TINY_SHAPE}),
            Scenario("mem", "tiny-expected", TINY, {TINY_SHAPE}, expect={{"cpu": "oom"}}),
            """
        )
    )
    result = run(project, "--perf-profile=cpu-256m", "--perf-op-profiles=auto")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["PASSED*mem.big-expected*"])
    result.stdout.fnmatch_lines(["mem.big-unexpected: unexpected_oom: ran out of memory*"])
    # One more launch recorded allocations up to the OOM (the profiler's memory records): the largest are named.
    result.stdout.fnmatch_lines(["rank ? largest allocations before the OOM: aten::* MiB*"])
    result.stdout.fnmatch_lines(["mem.tiny-expected: unexpected_pass:*--perf-update-baselines*"])
    # Both big runs really ran out of memory in a rank (status oom), the tiny one trained.
    result.stdout.fnmatch_lines(["mem.big-expected*oom*expected_oom*", "mem.big-unexpected*oom*unexpected_oom*"])


def test_an_unexpected_oom_is_never_recorded_silently(project: pytest.Pytester) -> None:
    project.makeconftest(OOM_CONFTEST)
    project.makepyfile(test_bench=bench_module(f'Scenario("mem", "big", {BIG}, {TINY_SHAPE}),'))
    path = project.path / "baselines" / "cpu-256m" / "mem.json"
    path.parent.mkdir(parents=True)
    kept = '{"schema_version": 1, "profile": "cpu-256m", "group": "mem", "scenarios": {}}\n'
    path.write_text(kept)
    refused = run(project, "--perf-profile=cpu-256m", "--perf-update-baselines")
    refused.assert_outcomes(failed=1)
    refused.stdout.fnmatch_lines(["*mem.big: unexpected_oom: *no baseline was recorded*--perf-accept-oom mem.big*"])
    assert path.read_text() == kept
    accepted = run(project, "--perf-profile=cpu-256m", "--perf-update-baselines", "--perf-accept-oom", "mem.big")
    accepted.assert_outcomes(passed=1)
    entry = json.loads(path.read_text())["scenarios"]["mem.big"]
    assert entry["expected"] == "oom" and entry["oom_accepted"]["via"] == "--perf-accept-oom"
    assert entry["oom_accepted"]["by"] and entry["oom_accepted"]["at"]
    usage = run(project, "--perf-profile=cpu-256m", "--perf-accept-oom", "mem.big")
    assert usage.ret == pytest.ExitCode.USAGE_ERROR
    typo = run(project, "--perf-profile=cpu-256m", "--perf-update-baselines", "--perf-accept-oom", "mem.bgi")
    assert typo.ret == pytest.ExitCode.USAGE_ERROR
    typo.stderr.fnmatch_lines(["*--perf-accept-oom mem.bgi: no selected scenario has this id*"])


FAULTS = """
import os, sys, threading, time
from perfsuite.rank.strategies.ddp import DDPStrategy

class Stray(DDPStrategy):
    def setup(self, model):
        super().setup(model)
        threading.Thread(target=time.sleep, args=(120,), name="stray").start()  # not a daemon

class Crash(DDPStrategy):
    def setup(self, model):
        super().setup(model)
        if self.ctx.rank == 1:
            raise RuntimeError("planted failure on rank 1")

class Hang(DDPStrategy):
    def forward_backward(self, batch, sync_grads):
        if self.ctx.rank == 1:
            print("rank 1 about to hang", file=sys.stderr, flush=True)
            time.sleep(3600)
        return super().forward_backward(batch, sync_grads)

class Exit(DDPStrategy):  # a library's exit(): no exception, no signal, no report
    def forward_backward(self, batch, sync_grads):
        if self.ctx.rank == 1:
            print("planted exit on rank 1", file=sys.stderr, flush=True)
            os._exit(7)
        return super().forward_backward(batch, sync_grads)
"""


@pytest.mark.parametrize(
    ("strategy", "timeout", "expected"),
    [
        ("faults:Crash", 120, ["*tiny.fault: error: workers crash: rank 1 during wrap*planted failure on rank 1*"]),
        (  # torchrun's summary names rank 1 and its code; rank 0, stopped after it, is not the cause
            "faults:Exit",
            120,
            [
                "*tiny.fault: error: workers crash: rank 1 during *: exited with code 7 before it could report*",
                "*none of the 1 scenario(s) measured anything (1 crash), so this run proves nothing*",
            ],
        ),
        (  # rank 1 hangs in its first step, ~5 s in (~10 s beside a busy xdist worker)
            "faults:Hang",
            18,
            [
                "*tiny.fault: error: workers timeout: rank 1 during warmup step 0*",
                "last lines it printed:",
                "rank 1 about to hang",
                "main thread, most recent call first:",
                '*File "*faults.py", line * in forward_backward*',
            ],
        ),
    ],
)
def test_failed_worker_is_reported_with_rank_and_leaves_nothing_behind(
    project: pytest.Pytester, strategy: str, timeout: int, expected: list[str]
) -> None:
    project.makepyfile(faults=FAULTS)
    project.makepyfile(
        test_bench=bench_module(f'Scenario("tiny", "fault", TINY, {TINY_SHAPE}, strategy="{strategy}"),')
    )
    start = time.monotonic()
    result = run(project, f"--perf-timeout={timeout}")
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=1)
    for line in expected:
        result.stdout.fnmatch_lines([line])
    result.stdout.fnmatch_lines(["*--- rank 1 stderr (tail) ---*"])
    assert elapsed < timeout + 30, f"took {elapsed:.0f}s with a {timeout}s timeout"
    assert leftover_workers(project.path) == []


def test_a_stray_thread_does_not_keep_a_finished_rank_alive(project: pytest.Pytester) -> None:
    """A non-daemon thread that outlives training (some library's) must not hold
    a rank that reported, forked or not: the run ends long before the thread's
    120 s, well inside its 60 s timeout."""
    project.makepyfile(faults=FAULTS)
    project.makepyfile(
        test_bench=bench_module(f'Scenario("tiny", "stray", TINY, {TINY_SHAPE}, strategy="faults:Stray"),')
    )
    start = time.monotonic()
    result = run(project, "--perf-timeout=60")
    result.assert_outcomes(skipped=1)  # no baseline: it trained and was measured
    assert time.monotonic() - start < 40
    assert leftover_workers(project.path) == []


def test_corrupt_baseline_is_a_clear_error_and_stays_byte_identical(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(ONE))
    path = baseline_path(project)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"schema_version": 1, "scenarios": {"tiny.fp32": ')
    for extra in ((), ("--perf-update-baselines",)):
        result = run(project, *extra)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"*baseline file {path}: content is not valid JSON*"])
        assert path.read_bytes() == b'{"schema_version": 1, "scenarios": {"tiny.fp32": '


def test_bad_scenario_fails_collection_naming_the_field(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=bench_module(f'Scenario("tiny", "bad", TINY, {TINY_SHAPE}, precision="fp8"),'))
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*scenario 'tiny.bad': field 'precision' must be one of fp32, fp16, bf16*"])


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--perf-profile=warp-drive", "*unknown profile 'warp-drive' for --perf-profile*"),
        ("--perf-timeout=-3", "*--perf-timeout must be a positive number*"),
        ("--perf-profile=", "*--perf-profile is empty: give a profile name*"),
        ("--perf-contention-budget=nan", "*--perf-contention-budget must be a finite number >= 0, got nan*"),
        ("--perf-rdzv-endpoint=127.0.0.1:29400", "*--perf-rdzv-endpoint only applies with --perf-launcher=torchrun*"),
        ("--perf-baselines=/nonexistent/dir", "*--perf-baselines /nonexistent/dir: no such folder*"),
        # Output paths are tried before anything runs, not after (root passes permission bits on /proc).
        (
            "--perf-json=/dev/null/r.json",
            "*--perf-json /dev/null/r.json: cannot write there: /dev/null is not a folder*",
        ),
        ("--perf-artifacts=/proc/perf", "*--perf-artifacts /proc/perf: cannot write there: /proc/perf: *"),
        ("--perf-history=/dev/null", "*--perf-history must name a folder*"),
        ("--perf-history=/proc/perf", "*--perf-history /proc/perf: cannot write there: /proc/perf: *"),
    ],
)
def test_bad_flag_is_a_usage_error(pytester: pytest.Pytester, flag: str, message: str) -> None:
    pytester.makepyfile(test_bench=bench_module(ONE))
    result = run(pytester, flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_missing_baselines_folder_is_fine_when_recording_into_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=bench_module(ONE))
    result = run(pytester, f"--perf-baselines={pytester.path / 'new'}", "--perf-update-baselines")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "new" / "cpu" / "tiny.json").is_file()


def test_hooks_choose_profile_and_add_metrics(project: pytest.Pytester) -> None:
    project.makeconftest(
        textwrap.dedent("""
        from perfsuite.core.profiles import CPU
        import dataclasses

        def pytest_perfsuite_profiles():
            return [dataclasses.replace(CPU, name="lab-box", aliases=("cpu",))]

        def pytest_perfsuite_hardware_key(fingerprint):
            return "lab-box"

        def pytest_perfsuite_extra_metrics(result):
            return {"loss_last": result.metrics.step_times_s[-1] > 0}
    """)
    )
    project.makepyfile(test_bench=bench_module(ONE))
    out = project.path / "r.json"
    # No --perf-profile here: the hardware-key hook must choose it.
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--perf-update-baselines", f"--perf-json={out}")
    result.assert_outcomes(passed=1)
    assert (project.path / "baselines" / "lab-box" / "tiny.json").exists()
    assert json.loads(out.read_text())["results"][0]["metrics"]["extra"] == {"loss_last": True}


def test_planted_slowdown_fails_after_confirmation(project: pytest.Pytester) -> None:
    project.makeconftest(JUDGE_UNDER_CONTENTION)
    project.makepyfile(test_bench=bench_module(f'Scenario("tiny", "fp32", TINY, {TINY_SHAPE}),'))
    run(project, "--perf-update-baselines").assert_outcomes(passed=1)
    # 4x the work per step: far beyond the cpu profile's 40% tolerance.
    result = run(project, "--perf-inject-slowdown=300")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*tiny.fp32: regression: samples_per_s*confirmed by 1 fresh measurement*"])


def test_calibrate_command_writes_tolerances(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(ONE))
    result = project.run(sys.executable, "-m", "perfsuite", "calibrate", "test_bench.py", "--repeats", "2", CPU_PROFILE)
    assert result.ret == 0, result.stdout.str()
    entry = json.loads(baseline_path(project).read_text())["scenarios"]["tiny.fp32"]
    assert set(entry["tolerances"]) == {
        "samples_per_s",
        "peak_mem_mib",
        "model_state_bytes_per_rank",
    }
    assert entry["calibration"]["repeats"] == 2


def test_gpu_fingerprint_picks_the_gpu_profile_and_the_cpu_pin_still_runs(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `make test` relies on: on a GPU machine (here NVML faked at its
    boundary with one H100) detection picks the GPU profile, and the cpu gate
    and self-tests still run because they pin the cpu profile."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA H100 80GB HBM3")
    project.makepyfile(test_bench=bench_module(ONE))
    out = project.path / "r.json"
    detected = project.runpytest_subprocess("-p", "no:cacheprovider", "-rA", f"--perf-json={out}")
    detected.assert_outcomes(skipped=1)
    assert detected.ret == pytest.ExitCode.TESTS_FAILED  # nothing could be measured on that one GPU
    doc = json.loads(out.read_text())
    assert doc["profile"] == "nvidia-h100-80gb-hbm3-x1" and doc["machine"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert doc["results"][0]["message"] == "needs 2 GPUs, 1 node(s) here have 1"
    run(project, "--perf-update-baselines").assert_outcomes(passed=1)
    assert baseline_path(project).exists()


CUDA_ONLY = f'Scenario("tiny", "fsdp", TINY, {TINY_SHAPE}, strategy="fairscale_fsdp"),'


def test_a_run_that_measured_nothing_is_not_green(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(CUDA_ONLY))
    result = run(project)
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*perfsuite: nothing was measured*",
            "all 1 scenario(s) skipped without measuring*tiny.fsdp: fairscale FSDP needs CUDA*",
        ]
    )


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (
            ["selftest", "-k", "fsdp", "--levels", "0", "--trials", "1"],
            "*perfsuite selftest: nothing was measured, so there is no gate to test (tiny.fsdp: skipped: fairscale FSDP needs CUDA*",
        ),
        (["calibrate", "--repeats", "2"], "*all 1 scenario(s) skipped without measuring*"),
    ],
)
def test_selftest_and_calibrate_refuse_scenarios_that_did_not_run(
    project: pytest.Pytester, command: list[str], message: str
) -> None:
    project.makepyfile(test_bench=bench_module(CUDA_ONLY))
    result = project.run(sys.executable, "-m", "perfsuite", command[0], "test_bench.py", *command[1:], CPU_PROFILE)
    assert result.ret == 1, result.stdout.str()
    (result.stderr if command[0] == "selftest" else result.stdout).fnmatch_lines([message])
