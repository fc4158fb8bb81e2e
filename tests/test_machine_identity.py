"""The machine in every fingerprint (issue 36): the processor and the GPU cards a baseline was
recorded on, verdicts that name both machines when they differ, cpu timing that is not judged
across processors while memory is, and GPU locks keyed by card UUID."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_NVML
from test_verdicts import SCENARIO, SLOW, STEADY, FakeLauncher

from perfsuite.core import processor as processors
from perfsuite.core.profiles import CPU, gpu_profile
from perfsuite.gate.session import PerfSession, RunSettings
from perfsuite.judge.coverage import Outcome, coverage_of
from perfsuite.launch import devicelock
from perfsuite.launch.devicelock import DeviceBusy
from perfsuite.launch.fingerprint import machine_fingerprint

#: Another processor: a Sapphire Rapids VM, with AVX-512 bf16 and AMX (a /proc/cpuinfo excerpt).
SAPPHIRE_RAPIDS = textwrap.dedent(
    """\
    processor\t: 0
    vendor_id\t: GenuineIntel
    cpu family\t: 6
    model\t\t: 143
    model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
    stepping\t: 8
    flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 aes

    processor\t: 1
    vendor_id\t: GenuineIntel
    model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
    """
)
#: An aarch64 host (Neoverse V2, a Grace CPU): no model name, an implementer and a part number.
GRACE = textwrap.dedent(
    """\
    processor\t: 0
    BogoMIPS\t: 2000.00
    Features\t: fp asimd evtstrm aes sha2 crc32 atomics fphp asimdhp sve sve2 bf16 i8mm svebf16 svei8mm
    CPU implementer\t: 0x41
    CPU architecture: 8
    CPU variant\t: 0x0
    CPU part\t: 0xd4f
    CPU revision\t: 0
    """
)


def read(tmp_path: Path, text: str) -> dict[str, Any]:
    (tmp_path / "cpuinfo").write_text(text)
    return processors.processor(tmp_path / "cpuinfo")


def test_the_processor_names_what_picks_its_kernels(tmp_path: Path) -> None:
    intel = read(tmp_path, SAPPHIRE_RAPIDS)
    assert (intel["vendor"], intel["family"], intel["model_number"], intel["stepping"]) == (
        "GenuineIntel",
        "6",
        "143",
        "8",
    )
    assert intel["model"].startswith("Intel(R) Xeon(R) Platinum 8481C")
    # Kernel features in a fixed order; flags no kernel dispatches on (sse, aes) are left out.
    assert intel["features"] == [
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ]
    arm = read(tmp_path, GRACE)
    assert (arm["vendor"], arm["model_number"]) == ("0x41", "0xd4f")
    assert arm["features"] == ["asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm", "svebf16", "svei8mm"]
    here = machine_fingerprint()["processor"]
    assert here["vendor"] and here["model"] and here["cores"] >= 1
    assert "avx512_bf16" in processors.describe(intel) and "0xd4f" in processors.describe(arm)


# -- cpu: timing is not judged across processors, memory is -------------------------------------
@pytest.fixture
def here() -> dict[str, Any]:
    return machine_fingerprint()


def judged(tmp_path: Path, fingerprint: dict[str, Any], launches: list[list[float]], **kw: Any) -> Any:
    launcher = FakeLauncher(launches, peaks=kw.pop("peaks", (100.0, 100.0)))
    settings = RunSettings(profile=kw.pop("profile", CPU), baselines_dir=tmp_path / "baselines", workdir=tmp_path, **kw)
    return PerfSession(settings, fingerprint, launcher).run(SCENARIO)


def doctor(tmp_path: Path, profile: str = "cpu", **changes: Any) -> None:
    """The one baseline entry with ``changes`` to its fingerprint and throughput x ``speed``."""
    path = tmp_path / "baselines" / profile / "g.json"
    doc = json.loads(path.read_text())
    entry = doc["scenarios"][SCENARIO.id]
    entry["metrics"]["samples_per_s"]["mean"] *= changes.pop("speed", 1.0)
    entry["fingerprint"].update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del entry["fingerprint"][key]
    path.write_text(json.dumps(doc))


def test_a_baseline_from_another_processor_at_twice_the_speed_is_no_regression_and_names_both(
    tmp_path: Path, here: dict[str, Any]
) -> None:
    assert judged(tmp_path, here, [STEADY], update_baselines=True).verdict == "recorded"
    intel = read(tmp_path, SAPPHIRE_RAPIDS)
    doctor(tmp_path, processor=intel, speed=2.0)

    elsewhere = judged(tmp_path, here, [STEADY], confirm=0)
    message = elsewhere.judgement.message
    assert elsewhere.verdict == "other_machine", message
    assert processors.describe(intel) in message and processors.describe(here["processor"]) in message
    assert "samples_per_s not judged" in message and "ab-rev" in message and "--perf-update-baselines" in message
    assert {c.metric for c in elsewhere.judgement.checks} >= {"peak_mem_mib", "model_state_bytes_per_rank"}
    assert "samples_per_s" not in {c.metric for c in elsewhere.judgement.checks}
    # Memory is still judged there: tripled peak memory is a regression, naming the processors.
    hungrier = judged(tmp_path, here, [STEADY], confirm=0, peaks=(300.0, 300.0))
    assert hungrier.verdict == "regression" and "peak_mem_mib" in hungrier.judgement.message
    assert processors.describe(intel) in hungrier.judgement.message

    doctor(tmp_path, processor=here["processor"])  # the same baseline, recorded on this processor
    same = judged(tmp_path, here, [STEADY], confirm=0)
    assert same.verdict == "regression" and "samples_per_s" in same.judgement.message
    assert {"samples_per_s", "peak_mem_mib"} <= {c.metric for c in same.judgement.checks}
    assert "another processor" not in same.judgement.message


def test_a_run_judged_on_memory_only_counts_as_judged_and_says_what_would_judge_its_timing() -> None:
    found = coverage_of(
        [Outcome("a", "other_machine", "...", memory=True), Outcome("b", "pass", timing=True, memory=True)]
    )
    assert found.ok and found.judged == ("a", "b") and found.timing_elsewhere == ("a",)
    assert found.line().endswith(
        "timing not judged, baseline from another processor: 1; judged: memory 2, timing 1 of 2"
    )
    (note,) = found.notes()
    assert note.startswith("other_machine: a: judged on memory only") and "ab-rev" in note
    assert coverage_of([Outcome("a", "other_machine", "...")]).ok


def test_a_baseline_without_a_machine_identity_is_judged_as_before_and_says_so(
    tmp_path: Path, here: dict[str, Any]
) -> None:
    judged(tmp_path, here, [STEADY], update_baselines=True)
    doctor(tmp_path, processor=None)  # as every baseline recorded before the processor was kept
    old = judged(tmp_path, here, [SLOW], confirm=0)
    assert old.verdict == "regression"
    assert "machine identity is unknown" in old.judgement.message and "the processor" in old.judgement.message


def test_recording_keeps_the_processor_and_a_normal_run_rewrites_nothing(tmp_path: Path, here: dict[str, Any]) -> None:
    judged(tmp_path, here, [STEADY], update_baselines=True)
    path = tmp_path / "baselines" / "cpu" / "g.json"
    entry = json.loads(path.read_text())["scenarios"][SCENARIO.id]
    assert entry["fingerprint"]["processor"] == here["processor"]
    doctor(tmp_path, processor=read(tmp_path, SAPPHIRE_RAPIDS))
    before = path.read_bytes()
    judged(tmp_path, here, [STEADY])
    assert path.read_bytes() == before


# -- GPUs: another card is judged, named; locks keyed by UUID -------------------------------------
@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)  # before running it: its dataclasses look themselves up there
    spec.loader.exec_module(module)
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA H100 80GB HBM3;NVIDIA H100 80GB HBM3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield


CARDS_A = "GPU-5f3c0e1a-0000-0000-0000-00000000000a;GPU-5f3c0e1a-0000-0000-0000-00000000000b"
CARDS_B = "GPU-77d1be02-0000-0000-0000-00000000000c;GPU-77d1be02-0000-0000-0000-00000000000d"
H100X2 = gpu_profile("nvidia-h100-80gb-hbm3-x2")


def test_the_gpu_fingerprint_names_each_card_and_its_speed_settings(
    fake_nvml: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_UUIDS", CARDS_A)
    fingerprint = machine_fingerprint()
    first = fingerprint["gpus"][0]
    assert first["uuid"] == CARDS_A.split(";")[0] and first["serial"] == "165000000000a"
    assert (first["power_limit_w"], first["app_clocks_mhz"], first["ecc"], first["nvlinks"]) == (
        700,
        {"sm": 1980, "mem": 2619},
        True,
        18,
    )
    assert fingerprint["interconnect"] == "nvlink"
    monkeypatch.setenv("FAKE_NVML_NVLINK", "0")
    monkeypatch.setenv("FAKE_NVML_FAIL", "nvmlDeviceGetSerial")  # a card that will not say: None, the rest read
    pcie = machine_fingerprint()
    assert pcie["interconnect"] == "pcie" and pcie["gpus"][0]["nvlinks"] is None
    assert pcie["gpus"][0]["serial"] is None and pcie["gpus"][0]["uuid"] == first["uuid"]


def test_a_baseline_from_another_card_is_judged_naming_both_cards(
    fake_nvml: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(devicelock.LOCK_DIR_VAR, str(tmp_path / "locks"))
    monkeypatch.setenv("FAKE_NVML_UUIDS", CARDS_A)
    card_a = machine_fingerprint()
    judged(tmp_path, card_a, [STEADY], update_baselines=True, profile=H100X2)
    monkeypatch.setenv("FAKE_NVML_UUIDS", CARDS_B)
    monkeypatch.setenv("FAKE_NVML_POWER_LIMIT_W", "500")
    card_b = machine_fingerprint()

    slower = judged(tmp_path, card_b, [SLOW], confirm=0, profile=H100X2)
    message = slower.judgement.message
    assert slower.verdict == "regression", message  # another card of the same SKU is still judged
    for uuid in (*CARDS_A.split(";"), *CARDS_B.split(";")):
        assert uuid in message
    assert "recorded on another card" in message and "(serial 165000000000a)" in message
    assert "GPU 0 power_limit_w 700 -> 500" in slower.judgement.stack_changes
    same = judged(tmp_path, card_a, [STEADY], confirm=0, profile=H100X2)
    assert same.verdict == "pass" and "another card" not in same.judgement.message


HOLDER = textwrap.dedent(
    """
    import sys, time
    from perfsuite.launch import devicelock
    with devicelock.hold([sys.argv[1]], "other.container", wait_s=5):
        print("held", flush=True)
        time.sleep(30)
    """
)


def test_the_gpu_lock_is_the_cards_uuid_whatever_index_a_container_gives_it(
    fake_nvml: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    locks = tmp_path / "shared-locks"  # one host folder, mounted into each container
    card = CARDS_B.split(";")[1]
    # Another container sees this card alone, as its GPU 0, and holds it.
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, card],
        stdout=subprocess.PIPE,
        text=True,
        env={**dict(__import__("os").environ), devicelock.LOCK_DIR_VAR: str(locks)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        # This container sees two cards; CUDA_VISIBLE_DEVICES=1 leaves the same card, as NVML's index 1.
        monkeypatch.setenv("FAKE_NVML_UUIDS", CARDS_B)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        fingerprint = machine_fingerprint()
        assert [(g["index"], g["uuid"]) for g in fingerprint["gpus"]] == [(1, card)]
        one_gpu = gpu_profile("nvidia-h100-80gb-hbm3-x1")
        scenario = SCENARIO.resolve(one_gpu.variant_keys)
        settings = RunSettings(
            profile=one_gpu, baselines_dir=tmp_path / "b", workdir=tmp_path, device_wait_s=1, lock_dir=locks
        )
        perf = PerfSession(settings, fingerprint, FakeLauncher([STEADY]))
        with pytest.raises(DeviceBusy, match=f"GPU {card} is held by another perfsuite run: pid {proc.pid}"):
            perf.launches.measure(scenario, "current", None, 1)
        assert devicelock.lock_path(card, locks).exists()
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_folder_comes_from_the_option_then_the_ini(pytester: pytest.Pytester) -> None:
    from perfsuite.plugin import options

    pytester.makeini("[pytest]\nperf_lock_dir = /mnt/host-locks\n")
    assert options.lock_dir(pytester.parseconfig()) == Path("/mnt/host-locks")
    assert options.lock_dir(pytester.parseconfig("--perf-lock-dir", "/var/lock/perfsuite")) == Path(
        "/var/lock/perfsuite"
    )


def test_another_processor_under_a_gpu_profile_is_judged_and_named(tmp_path: Path, here: dict[str, Any]) -> None:
    gpu_like = dataclasses.replace(CPU, name="gpu-like", timed_on_other_processor=True)
    judged(tmp_path, here, [STEADY], update_baselines=True, profile=gpu_like)
    doctor(tmp_path, profile="gpu-like", processor=read(tmp_path, SAPPHIRE_RAPIDS), speed=2.0)
    result = judged(tmp_path, here, [STEADY], confirm=0, profile=gpu_like)
    assert result.verdict == "regression" and "samples_per_s" in result.judgement.message
    assert "recorded on another processor: Intel(R) Xeon(R) Platinum 8481C" in result.judgement.message


def test_a_straggler_rank_is_judged_whichever_processor_recorded_the_baseline(
    tmp_path: Path, here: dict[str, Any]
) -> None:
    judged(tmp_path, here, [STEADY], update_baselines=True)
    doctor(tmp_path, processor=read(tmp_path, SAPPHIRE_RAPIDS))
    lopsided = dataclasses.replace(SCENARIO, max_imbalance={"peak_mem_mib": 1.5})
    launcher = FakeLauncher([STEADY], peaks=(60.0, 100.0))  # no rank over the baseline's 100 MiB, 1.67x apart
    settings = RunSettings(profile=CPU, baselines_dir=tmp_path / "baselines", workdir=tmp_path, confirm=0)
    result = PerfSession(settings, here, launcher).run(lopsided)
    assert result.verdict == "imbalance" and "peak_mem_mib max/min across ranks 1.67" in result.judgement.message
    assert "samples_per_s not judged, recorded on another processor" in result.judgement.message


def test_cards_are_matched_by_uuid_and_an_old_baseline_says_their_identity_is_unknown(
    fake_nvml: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfsuite.launch import identity

    monkeypatch.setenv("FAKE_NVML_UUIDS", CARDS_A)
    recorded = machine_fingerprint()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # the same two cards, in the other order
    reordered = machine_fingerprint()
    assert identity.compare(recorded, reordered).changes == ()
    assert identity.card_setting_changes(recorded, reordered) == []
    old = {**recorded, "gpus": [{k: v for k, v in g.items() if k != "uuid"} for g in recorded["gpus"]]}
    unknown = identity.compare(old, reordered).unknown
    assert "the cards' UUIDs" in unknown and "the processor" not in unknown
    without_gpus = {**recorded, "gpus": []}  # e.g. --perf-profile=cpu on a GPU host: nothing to say of cards
    assert identity.compare(without_gpus, reordered) == identity.Identity()


def test_a_mig_uuid_names_a_lock_file(tmp_path: Path) -> None:
    path = devicelock.lock_path("MIG-GPU-5f3c0e1a-0000-0000-0000-00000000000a/1/0", tmp_path)
    assert path.parent == tmp_path and path.name == "gpu-MIG-GPU-5f3c0e1a-0000-0000-0000-00000000000a_1_0.lock"


def test_selftest_refuses_baselines_from_another_processor(tmp_path: Path) -> None:
    from perfsuite.__main__ import trial_verdicts

    out = tmp_path / "r.json"
    out.write_text(json.dumps({"results": [{"id": "a.b", "status": "ok", "verdict": "other_machine", "message": ""}]}))
    with pytest.raises(SystemExit, match=r"a\.b were recorded on another processor"):
        trial_verdicts(out, ["pytest"], 0)


def test_bootstrap_records_again_what_another_processor_recorded(tmp_path: Path, here: dict[str, Any]) -> None:
    from perfsuite.commands.bootstrap.plan import Target
    from perfsuite.commands.bootstrap.run import usable
    from perfsuite.commands.bootstrap.state import done_in
    from perfsuite.store.baselines import BaselineStore

    judged(tmp_path, here, [STEADY], update_baselines=True)
    targets = [Target(SCENARIO.id, "g", "nodeid", "train", 2, "shape")]
    store = BaselineStore(tmp_path / "baselines", "cpu")
    assert done_in(store, targets, 1, usable(here, CPU)).baselines == {SCENARIO.id}
    doctor(tmp_path, processor=read(tmp_path, SAPPHIRE_RAPIDS))
    store = BaselineStore(tmp_path / "baselines", "cpu")
    assert done_in(store, targets, 1, usable(here, CPU)).baselines == set()
    gpu_like = dataclasses.replace(CPU, timed_on_other_processor=True)
    assert done_in(store, targets, 1, usable(here, gpu_like)).baselines == {SCENARIO.id}


def test_the_lock_folder_option_reaches_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_folder(perf_session):\n    print('LOCKS', perf_session.settings.lock_dir)\n")
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--perf-lock-dir", "/mnt/host-locks")
    result.stdout.fnmatch_lines(["*LOCKS /mnt/host-locks*"])
