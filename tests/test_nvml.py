"""NVML correctness on the rank side (issue: GPU runners for real), with NVML
faked at its boundary (tests/fake_nvml): device mapping by UUID, the current
clock-event API, container PIDs, failures that degrade instead of crashing, and
throttling that makes a verdict unreliable."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import FAKE_NVML

from perfsuite.rank.worker import nvml as nvml_module
from perfsuite.rank.worker.health import CudaHealthTracker
from perfsuite.rank.worker.nvml import NvmlDevice

CUDA0 = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA H100 80GB HBM3;NVIDIA H100 80GB HBM3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_cuda_device_is_found_by_uuid_before_index(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA's device 0 is NVML's device 1 (FASTEST_FIRST order, or a UUID list in CUDA_VISIBLE_DEVICES).
    monkeypatch.setattr(nvml_module, "cuda_uuid", lambda device: "GPU-00000000-0000-0000-0000-000000000001")
    gpu = NvmlDevice(CUDA0)
    assert (gpu.mapped_by, gpu.handle.index) == ("uuid", 1)


def test_without_a_uuid_the_index_goes_through_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu = NvmlDevice(CUDA0)  # a CPU build of torch has no device properties: no UUID
    assert (gpu.mapped_by, gpu.handle.index) == ("index", 1)


@pytest.mark.parametrize("old_api", ["", "1"])
def test_throttle_reasons_and_sync_boost(monkeypatch: pytest.MonkeyPatch, old_api: str) -> None:
    monkeypatch.setenv("FAKE_NVML_OLD_API", old_api)
    monkeypatch.setenv("FAKE_NVML_REASONS", str(0x40 | 0x10))  # hw thermal slowdown + sync boost
    with CudaHealthTracker(CUDA0) as health:
        health.sample()
    assert health.result["throttle_reasons"] == ["hw_thermal", "sync_boost"] and health.result["throttled"]
    assert health.result["power_w"]["max"] == 650.0
    monkeypatch.setenv("FAKE_NVML_REASONS", str(0x10))  # sync boost alone slows nothing
    with CudaHealthTracker(CUDA0) as health:
        health.sample()
    assert health.result["throttle_reasons"] == ["sync_boost"] and not health.result["throttled"]


def test_the_cards_own_power_cap_is_recorded_but_not_throttling(monkeypatch: pytest.MonkeyPatch) -> None:
    # What an H200 reported on every step of every dense matmul (2026-11-26).
    monkeypatch.setenv("FAKE_NVML_REASONS", str(0x4))
    with CudaHealthTracker(CUDA0) as health:
        health.sample()
    assert health.result["throttle_reasons"] == ["sw_power_cap"] and not health.result["throttled"]
    assert health.result["power_limit_w"] == 700.0


def test_energy_over_the_measured_steps_comes_from_the_energy_counter() -> None:
    with CudaHealthTracker(CUDA0) as health:
        time.sleep(0.2)
        health.sample()
    assert health.result["energy_j"] == pytest.approx(0.2 * 650, rel=0.5)  # 650 W for ~0.2 s


def test_an_nvml_failure_degrades_the_record_not_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_FAIL", "nvmlDeviceGetPowerUsage")
    with CudaHealthTracker(CUDA0) as health:
        health.sample()
        health.sample()
    assert "power failed: NVMLError" in health.result["nvml_error"] and "power_w" not in health.result
    assert health.result["samples"] == 2
    monkeypatch.setenv("FAKE_NVML_GPUS", "")  # nvmlInit itself fails
    with CudaHealthTracker(CUDA0) as health:
        health.sample()
    assert health.result["nvml_error"].startswith("NVML unavailable")


def test_process_memory_falls_back_to_the_device_in_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_PROCS", f"{os.getpid()}:{5 * 2**30},4242:{2**30}")
    assert NvmlDevice(CUDA0).process_memory() == (5 * 2**30, "process")
    # In a container NVML lists host PIDs: ours is not among them.
    monkeypatch.setenv("FAKE_NVML_PROCS", f"{os.getpid() + 100000}:{5 * 2**30}")
    assert NvmlDevice(CUDA0).process_memory() == (3 * 2**30, "device")


def test_a_throttled_run_is_unreliable_and_not_recorded(tmp_path: Path) -> None:
    from test_verdicts import FINGERPRINT, SCENARIO, STEADY, FakeLauncher

    from perfsuite.core.profiles import CPU
    from perfsuite.gate.session import PerfSession, RunSettings

    health = {"throttled": True, "throttle_reasons": ["hw_thermal", "sync_boost"]}
    run = RunSettings(profile=CPU, baselines_dir=tmp_path / "b", workdir=tmp_path, update_baselines=True)
    result = PerfSession(run, FINGERPRINT, FakeLauncher([STEADY], health=health)).run(SCENARIO)
    assert result.verdict == "unreliable"
    assert (
        "GPU throttled during the measured steps (rank 0: hw_thermal; rank 1: hw_thermal)" in result.judgement.message
    )
    assert not (tmp_path / "b" / "cpu" / "g.json").exists()


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [0, 1]),
        ("1", [1]),
        ("GPU-00000000-0000-0000-0000-000000000001", ["GPU-00000000-0000-0000-0000-000000000001"]),
        ("0,GPU-unknown,1", [0]),  # CUDA stops at the first entry it cannot use
    ],
)
def test_the_fingerprint_sees_the_gpus_cuda_visible_devices_leaves(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, expected: list[object]
) -> None:
    from perfsuite.launch.fingerprint import machine_fingerprint

    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    fingerprint = machine_fingerprint()
    assert [g["index"] for g in fingerprint["gpus"]] == expected and fingerprint["gpu_count"] == len(expected)
