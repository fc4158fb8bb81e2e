"""``python -m perfsuite doctor`` on the cpu profile (issue: GPU runners for real)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import CPU_PROFILE, FAKE_NVML

from perfsuite.commands import doctor
from perfsuite.core.engines import EngineSpec, engine_spec
from perfsuite.core.profiles import CPU
from tests.test_coverage import PHANTOM

BENCH = str(Path(__file__).parents[1] / "bench_tests")
MCORE = engine_spec("megatron_core")


def test_doctor_reports_engines_and_scenarios_without_smoke_runs(pytester: pytest.Pytester) -> None:
    result = pytester.run(sys.executable, "-m", "perfsuite", "doctor", BENCH, "--no-smoke", CPU_PROFILE)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "profile: cpu (device cpu)",
            "engines (import check):",
            "  ddp * imports",
            "  fairscale_fsdp * skip: fairscale FSDP needs CUDA*",
            "  megatron_core * skip: megatron-core's tensor/pipeline-parallel layers*",
            f"scenarios in {BENCH}: * would run, * skip",
            "  mixed_precision.amp * run on 2 rank(s)",
            "  parallel_3d.tp4_pp4 * skip: needs 16 ranks; profile cpu runs at most 4*",
            "result: OK",
        ]
    )


def test_doctor_smoke_runs_an_engine_through_torchrun(pytester: pytest.Pytester) -> None:
    result = pytester.run(
        sys.executable, "-m", "perfsuite", "doctor", BENCH, "--engines", "ddp", "-k", "mixed", CPU_PROFILE
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["  ddp * imports; smoke ok (*s)", "result: OK"])


def test_the_cpu_pin_wins_over_the_gpus_present(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a GPU runner's `make test` does: the self-tests judge cpu behaviour, whatever NVML shows.
    monkeypatch.setenv("PYTHONPATH", str(FAKE_NVML))
    monkeypatch.setenv("FAKE_NVML_GPUS", ";".join(["NVIDIA H100 80GB HBM3"] * 8))
    result = pytester.run(sys.executable, "-m", "perfsuite", "doctor", BENCH, "--no-smoke", "-k", "mixed", CPU_PROFILE)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["GPUs: 8: *", "profile: cpu (device cpu)", "  mixed_precision.amp * run on 2 rank(s)"])


FAULTS = """
from perfsuite.rank.strategies.ddp import DDPStrategy

class Broken(DDPStrategy):
    def setup(self, model):
        raise RuntimeError("engine broke during setup")
"""


def test_an_engine_that_should_work_but_does_not_fails_the_doctor(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(broken_engine=FAULTS)
    monkeypatch.syspath_prepend(str(pytester.path))
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    broken = EngineSpec("broken_engine:Broken", "broken_engine:Broken")  # a user engine named by its path
    monkeypatch.setattr(doctor, "ENGINES", [broken])
    (check,) = doctor.check_engines(CPU, gpus=0, names=None, run_smoke=True)
    # Every rank breaks alike; the blame goes to one that reported it (torchrun may stop the other first).
    assert check.broken and re.match(r"crash: rank [01] during wrap: RuntimeError: engine broke", check.smoke)
    missing = EngineSpec("missing", "no_such_module_anywhere:Strategy")
    monkeypatch.setattr(doctor, "ENGINES", [missing])
    (check,) = doctor.check_engines(CPU, gpus=0, names=None, run_smoke=True)
    assert check.broken and "ModuleNotFoundError" in check.import_error and check.smoke == ""


def test_a_scenario_whose_engine_is_not_installed_fails_the_doctor_naming_the_extra(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_phantom=PHANTOM + "\n@parametrize(PHANTOM_ROWS)\ndef test_it(perf, scenario):\n    pass\n")
    result = pytester.run(sys.executable, "-m", "perfsuite", "doctor", str(pytester.path), "--no-smoke", CPU_PROFILE)
    assert result.ret == 1, result.stdout.str()
    install = "pip install 'perfsuite[megatron]'"
    assert f"  not installed: 2 rows need perfsuite[megatron] ({install}): phantom.a, phantom.b" in result.outlines
    result.stdout.fnmatch_lines(["  phantom.a * skip: perfsuite_phantom_engine.core is not installed*"])


@pytest.mark.parametrize(
    ("gpus", "lines"),
    [
        (
            1,
            [
                "profile: nvidia-h100-80gb-hbm3-x1 (device cuda)",
                "scenarios in *: 55 would run, 76 skip",
                "  microbench.matmul_best_bf16 * run on 1 rank(s)",
                "  microbench.device_copy * run on 1 rank(s)",
                "  cluster_gpt.n1_tp8_pp1 * skip: needs 8 GPUs, 1 node(s) here have 1",
                "  collectives.all_reduce_large * skip: needs at least 2 GPUs (runs on 2, 4, 8), 1 node(s) here have 1",
                "  engines_1gpu.fairscale_fsdp_amp * run on 1 rank(s)",
                "  engines_1gpu.zero3_offload_amp * run on 1 rank(s)",
                "  mixed_precision.amp * run on 1 rank(s)",
                "  model_state_sharding.ddp_amp * run on 1 rank(s)",
                "  model_state_sharding.zero2_amp * skip: needs at least 2 GPUs (runs on 2, 4), 1 node(s) here have 1",
                "  parallel_3d.tp1_pp1 * run on 1 rank(s)",
                "  parallel_3d.tp2_pp2 * skip: needs 4 GPUs, 1 node(s) here have 1",
                "  trainer_sweep.gpu1_bs8_fp16 * run on 1 rank(s)",
                "  trainer_sweep.gpu2_bs8_fp16 * skip: needs 2 GPUs, 1 node(s) here have 1",
            ],
        ),
        (
            8,
            [
                "profile: nvidia-h100-80gb-hbm3-x8 (device cuda)",
                "  cluster_gpt.n1_tp8_pp1 * run on 8 rank(s)",
                "  cluster_gpt.n2_tp8_pp1 * skip: needs 16 GPUs, 1 node(s) here have 8",
                "  collectives.all_reduce_large * run on 8 rank(s)",
                "  engines_1gpu.zero3_amp * run on 1 rank(s)",
                "  mixed_precision.amp * run on 4 rank(s)",
                "  model_state_sharding.fairscale_fsdp_amp * run on 4 rank(s)",
                "  parallel_3d.tp4_pp4 * skip: needs 16 GPUs, 1 node(s) here have 8",
            ],
        ),
    ],
)
def test_the_gpus_present_decide_what_runs_and_at_which_size(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, gpus: int, lines: list[str]
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FAKE_NVML))
    monkeypatch.setenv("FAKE_NVML_GPUS", ";".join(["NVIDIA H100 80GB HBM3"] * gpus))
    result = pytester.run(sys.executable, "-m", "perfsuite", "doctor", BENCH, "--no-smoke")
    # The megatron-core rows need perfsuite[megatron] (Python 3.12+): where it is missing, the doctor says so.
    assert result.ret == (0 if MCORE.missing_package("cuda") is None else 1), result.stdout.str()
    result.stdout.fnmatch_lines(lines)
    if MCORE.missing_package("cuda") is not None:
        result.stdout.fnmatch_lines(["result: PROBLEMS", "  not installed: * rows need perfsuite?megatron? (*"])


def test_an_engine_name_the_doctor_does_not_know_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A typo must not check nothing and say OK."""
    assert doctor.run(["bench_tests"], None, ["ddp", "nosuch"], run_smoke=False) == 2
    err = capsys.readouterr().err
    assert "--engines names no engine nosuch; known: ddp, " in err and "deepspeed_zero" in err
