"""Calibration pooled across machines (perfsuite.judge.calibration, perfsuite.commands.bootstrap.pool): fake runners
whose launches differ by a machine offset, measured and judged without launching torch."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from perfsuite import Scenario
from perfsuite.__main__ import main
from perfsuite.core.models import ModelSpec
from perfsuite.core.profiles import CPU, PROVISIONAL_GPU_MACHINE_SPREAD, HardwareProfile, gpu_profile
from perfsuite.core.protocol import RankReport
from perfsuite.gate.session import PerfSession, RunSettings
from perfsuite.judge.calibration import spread_of, tolerance
from perfsuite.launch import Launcher, LaunchOutcome, WorkerJob

SCENARIO = Scenario(
    "g", "s", ModelSpec("bert", 1, 32, 2, 512, 32), world_size=2, micro_batch=2, global_batch=4, seq_len=16, steps=5
)
PROCESSOR = {
    "vendor": "GenuineIntel",
    "model": "Xeon",
    "family": 6,
    "model_number": 85,
    "stepping": 7,
    "cores": 2,
    "features": ["avx2"],
}
#: A profile of quiet machines, as a GPU runner's: a 3% floor, timing judged across machines,
#: and no provisional machine spread, so a single machine's tolerance sees its launches only.
FLEET = dataclasses.replace(CPU, name="fleet", calibration_floor=0.03, timed_on_other_processor=True)
#: The same with the GPU profiles' provisional machine spread.
PROVISIONAL = dataclasses.replace(FLEET, machine_spread=PROVISIONAL_GPU_MACHINE_SPREAD)
#: Each launch's offset from its machine's mean: a launch-to-launch CV of ~0.3%.
LAUNCH_NOISE = (1.0, 1.004, 0.996, 1.003, 0.997)
STEP_JITTER = (1.0, 1.002, 0.998, 1.001, 0.999)


def fingerprint(host: str, processor: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "host": host,
        "processor": processor or PROCESSOR,
        "gpus": [],
        "gpu_count": 0,
        "packages": {"torch": "2.13.0"},
    }


class RateLauncher(Launcher):
    """Each launch trains at the next rate (samples/s) of ``rates``, on both ranks."""

    name = "rates"

    def __init__(self, rates: Sequence[float]) -> None:
        self.rates = iter(rates)

    def run(self, job: WorkerJob) -> LaunchOutcome:
        rate = next(self.rates)
        times = tuple(SCENARIO.global_batch / rate * j for j in STEP_JITTER)
        state = {"params": 1, "grads": 1, "optimizer": 2}
        reports = [
            RankReport(
                rank=r,
                status="ok",
                step_times_s=times,
                steady_state_start=2,
                runtime={"torch": "2.13.0"},
                model_state={**state, "total": 4},
                metrics={
                    "peak_mem_mib": 100.0,
                    "model_state_bytes_per_rank": 4,
                    **{f"model_state.{k}": v for k, v in state.items()},
                },
            )
            for r in (0, 1)
        ]
        return LaunchOutcome("ok", reports)


def run(
    root: Path, host: str, rates: Sequence[float], profile: HardwareProfile = FLEET, **settings: Any
) -> tuple[str, str]:
    """One pytest session on runner ``host`` over the baselines under ``root``: (verdict, message)."""
    root.mkdir(parents=True, exist_ok=True)
    options = RunSettings(profile=profile, baselines_dir=root / "baselines", workdir=root, **settings)
    result = PerfSession(options, fingerprint(host), RateLauncher(rates)).run(SCENARIO)
    return result.verdict, result.judgement.message


def calibrate(root: Path, host: str, rate: float, profile: HardwareProfile = FLEET) -> str:
    verdict, message = run(root, host, [rate * f for f in LAUNCH_NOISE], profile, calibrate=True, repeats=5, confirm=0)
    assert verdict == "recorded", message
    return message


def stored(root: Path, profile: str = "fleet") -> dict[str, Any]:
    doc = json.loads((root / "baselines" / profile / "g.json").read_text())
    entry: dict[str, Any] = doc["scenarios"]["g.s"]
    return entry


def gate(root: Path, host: str, rate: float) -> str:
    """A plain gate run (one launch, confirmed by one more) on runner ``host``."""
    return run(root, host, [rate, rate])[0]


def test_pooled_calibration_from_two_fake_runners_covers_their_offset(tmp_path: Path) -> None:
    # Runner A measures 100 samples/s, runner B 96, each +-0.3% launch to launch.
    calibrate(tmp_path, "runner-a", 100.0)
    alone = stored(tmp_path)
    assert alone["tolerances"]["samples_per_s"] == 0.03  # 3 x sqrt(2) x 0.3%: below the floor
    assert gate(tmp_path, "runner-b", 96.0) == "regression"  # B's offset fails against A's baseline
    message = calibrate(tmp_path, "runner-b", 96.0)
    entry = stored(tmp_path)
    calibration = entry["calibration"]
    assert calibration["machines"] == 2 and calibration["repeats"] == 10
    assert {s["label"].split()[0] for s in calibration["sources"]} == {"runner-a", "runner-b"}
    assert calibration["machine_spread_basis_samples_per_s"] == "measured"
    assert calibration["machine_spread_samples_per_s"] == pytest.approx(0.0287, abs=0.002)  # 4 / 98 / sqrt(2)
    assert calibration["cv_samples_per_s"] == pytest.approx(0.0033, abs=0.0005)
    assert entry["metrics"]["samples_per_s"]["mean"] == pytest.approx(98.0, rel=1e-3)  # the machines' mean
    assert entry["metrics"]["samples_per_s"]["n"] == 50
    pooled = entry["tolerances"]["samples_per_s"]
    assert 0.04 < pooled < 0.15 and "2 machine(s), 10 launches" in message and "measured" in message
    # Both runners' fresh runs pass against the pooled baseline; a 15% slowdown on either still fails.
    assert gate(tmp_path, "runner-a", 100.0) == "pass"
    assert gate(tmp_path, "runner-b", 96.0) == "pass"
    assert gate(tmp_path, "runner-b", 96.0 / 1.15) == "regression"
    assert gate(tmp_path, "runner-a", 100.0 / 1.15) == "regression"


def test_one_machine_falls_back_to_the_profiles_provisional_spread(tmp_path: Path) -> None:
    assert gpu_profile("nvidia-h100-80gb-hbm3-x1").machine_spread == PROVISIONAL_GPU_MACHINE_SPREAD == 0.012
    assert CPU.machine_spread is None
    message = calibrate(tmp_path, "runner-a", 100.0, PROVISIONAL)
    entry = stored(tmp_path)
    calibration = entry["calibration"]
    assert calibration["machine_spread_basis_samples_per_s"] == "provisional"
    assert calibration["machine_spread_samples_per_s"] == 0.012
    assert "machine_spread_measured_samples_per_s" not in calibration
    cv = calibration["cv_samples_per_s"]
    expected = round(3 * math.sqrt(2 * cv**2 + 2 * 0.012**2), 3)  # the difference of two machines' draws
    assert entry["tolerances"]["samples_per_s"] == expected and 0.05 < expected < 0.06
    assert "PROVISIONAL" in message and "one machine" in message


def test_two_machines_that_happen_to_agree_keep_the_provisional_spread(tmp_path: Path) -> None:
    calibrate(tmp_path, "runner-a", 100.0, PROVISIONAL)
    message = calibrate(tmp_path, "runner-b", 100.1, PROVISIONAL)
    calibration = stored(tmp_path)["calibration"]
    assert calibration["machine_spread_basis_samples_per_s"] == "provisional"
    assert calibration["machine_spread_measured_samples_per_s"] < 0.012
    assert calibration["machine_spread_samples_per_s"] == 0.012
    assert "2 machines measured" in message


def test_the_tolerance_model() -> None:
    assert tolerance(0.003, 0.0, 1, 0.03) == 0.03  # the floor
    assert tolerance(0.01, 0.0, 1, 0.0) == round(3 * math.sqrt(2) * 0.01, 3)  # one machine, no spread
    assert tolerance(0.003, 0.02, 4, 0.0) == round(3 * math.sqrt(2 * 0.003**2 + 1.25 * 0.02**2), 3)
    assert tolerance(0.5, 0.5, 1, 0.03) == 0.9  # the ceiling
    spread = spread_of([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # textbook one-way ANOVA
    assert spread.mean == 3.5 and spread.cv_launch == pytest.approx(1 / 3.5)
    assert spread.machine == pytest.approx(math.sqrt((13.5 - 1) / 3) / 3.5)
    assert spread_of([[1.0, 3.0], [2.0, 2.0]]).machine == 0.0  # means that agree: floored at 0


def test_a_machine_recalibrated_replaces_its_own_launches(tmp_path: Path) -> None:
    calibrate(tmp_path, "runner-a", 100.0)
    calibrate(tmp_path, "runner-b", 96.0)
    calibrate(tmp_path, "runner-b", 97.0)
    calibration = stored(tmp_path)["calibration"]
    assert calibration["machines"] == 2
    assert stored(tmp_path)["metrics"]["samples_per_s"]["mean"] == pytest.approx(98.5, rel=1e-3)


def test_a_plain_update_ends_the_pool_and_keeps_its_tolerance(tmp_path: Path) -> None:
    calibrate(tmp_path, "runner-a", 100.0)
    calibrate(tmp_path, "runner-b", 96.0)
    pooled = stored(tmp_path)["tolerances"]["samples_per_s"]
    assert run(tmp_path, "runner-a", [110.0], update_baselines=True)[0] == "recorded"
    entry = stored(tmp_path)
    assert "sources" not in entry["calibration"] and "--perf-update-baselines" in entry["calibration"]["pool_ended"]
    assert entry["tolerances"]["samples_per_s"] == pooled
    calibrate(tmp_path, "runner-b", 106.0)  # a new pool: runner A's 100 measured the old code
    assert stored(tmp_path)["calibration"]["machines"] == 1


def test_a_changed_definition_is_not_pooled_with_the_old_launches(tmp_path: Path) -> None:
    calibrate(tmp_path, "runner-a", 100.0)
    global SCENARIO
    original, SCENARIO = SCENARIO, dataclasses.replace(SCENARIO, micro_batch=1)
    try:
        calibrate(tmp_path, "runner-b", 96.0)
    finally:
        SCENARIO = original
    calibration = stored(tmp_path)["calibration"]
    assert calibration["machines"] == 1
    (why,) = calibration["not_pooled"]
    assert why.startswith("runner-a") and "definition changed since" in why and "micro_batch 2 -> 1" in why


def runner_trees(tmp_path: Path) -> tuple[Path, Path]:
    """Two runners that calibrated on their own, each in its own checkout."""
    a, b = tmp_path / "a", tmp_path / "b"
    calibrate(a, "runner-a", 100.0)
    calibrate(b, "runner-b", 96.0)
    return a, b


def test_the_pool_command_merges_the_runners_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runner_trees(tmp_path)
    local = tmp_path / "local"
    assert (
        main(
            [
                "calibrate",
                "--pool",
                str(a / "baselines"),
                str(b / "baselines" / "fleet" / "g.json"),
                "--into",
                str(local / "baselines"),
            ]
        )
        == 0
    )
    line = capsys.readouterr().out
    assert line.startswith("g.s: samples_per_s tolerance") and "2 machine(s), 10 launches" in line
    entry = stored(local)
    assert entry["calibration"]["machines"] == 2 and entry["metrics"]["samples_per_s"]["mean"] == pytest.approx(
        98.0, rel=1e-3
    )
    first = entry["tolerances"]
    assert main(["calibrate", "--pool", str(a / "baselines"), "--into", str(local / "baselines")]) == 0
    assert stored(local)["tolerances"] == first  # pooling a runner twice counts it once
    assert gate(local, "runner-b", 96.0) == "pass" and gate(local, "runner-b", 96.0 / 1.15) == "regression"


def pool_error(*args: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(["calibrate", "--pool", *args])
    return str(caught.value)


def test_bad_pool_inputs_are_refused_naming_the_file(tmp_path: Path) -> None:
    a, b = runner_trees(tmp_path)
    into = ["--into", str(a / "baselines")]
    missing = tmp_path / "runner-c"
    assert f"{missing}: no such file or folder" in pool_error(str(missing), *into)
    doc = json.loads((b / "baselines" / "fleet" / "g.json").read_text())
    other = tmp_path / "h200.json"
    other.write_text(json.dumps({**doc, "profile": "nvidia-h200-x1"}))
    error = pool_error(str(other), "--profile", "fleet", *into)
    assert f"{other}: holds calibrations of profile nvidia-h200-x1, not fleet" in error
    changed = tmp_path / "changed.json"
    doc["scenarios"]["g.s"]["definition"]["micro_batch"] = 8
    changed.write_text(json.dumps(doc))
    error = pool_error(str(changed), *into)
    assert f"{changed}: g.s was calibrated for another definition" in error and "micro_batch 2 -> 8" in error
    assert "Calibrate that runner at this commit" in error
    plain = tmp_path / "plain"
    assert run(plain, "runner-c", [99.0], update_baselines=True)[0] == "recorded"
    assert "holds no calibration with per-launch values" in pool_error(str(plain / "baselines"), *into)
    assert "takes no pytest arguments: -x" in pool_error(str(b / "baselines"), "-x", *into)


def test_a_profile_that_times_one_processor_pools_only_that_processor(tmp_path: Path) -> None:
    cpu_a, cpu_b = tmp_path / "a", tmp_path / "b"
    profile = dataclasses.replace(FLEET, timed_on_other_processor=False)
    calibrate(cpu_a, "runner-a", 100.0, profile)
    options = RunSettings(
        profile=profile, baselines_dir=cpu_b / "baselines", workdir=cpu_b, calibrate=True, repeats=5, confirm=0
    )
    cpu_b.mkdir()
    amd = {**PROCESSOR, "vendor": "AuthenticAMD", "model": "EPYC"}
    PerfSession(options, fingerprint("runner-b", amd), RateLauncher([50.0 * f for f in LAUNCH_NOISE])).run(SCENARIO)
    before = stored(cpu_a)
    # Another processor's calibration is not pooled with this one's: it becomes that processor's
    # entry beside it (issue 48, item 4), and the first entry is written back as it was.
    assert main(["calibrate", "--pool", str(cpu_b / "baselines"), "--into", str(cpu_a / "baselines")]) == 0
    after = stored(cpu_a)
    [theirs] = after.pop("other_processors")
    assert after == before
    assert theirs["fingerprint"]["processor"] == amd and theirs["calibration"]["machines"] == 1
    assert theirs["metrics"]["samples_per_s"]["mean"] == pytest.approx(50.0, rel=1e-2)
    assert {s["label"].split()[0] for s in theirs["calibration"]["sources"]} == {"runner-b"}
