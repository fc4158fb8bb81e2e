"""cpu baselines per processor (issue 48, item 4): one group file keeps an entry per processor
for each scenario, so two machines of the cpu profile never overwrite each other's; a run's
timing is judged against its own processor's entry, its memory against its own or else the
scenario's first entry; old single-entry files load unchanged; GPU profiles keep one entry."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_verdicts import FINGERPRINT, SCENARIO, SLOW, STEADY, FakeLauncher

from perfsuite.core import processor as processors
from perfsuite.core.opprofile import OpProfile, OpStat
from perfsuite.core.profiles import CPU
from perfsuite.gate.session import PerfSession, RunSettings, ScenarioResult
from perfsuite.judge.explain import Explanation
from perfsuite.store.baselines import OTHER_PROCESSORS, BaselineError, BaselineStore, load_group
from perfsuite.store.profilestore import Lookup, ProfileStore

REPO = Path(__file__).resolve().parents[1]


def proc(model: str, vendor: str, family: str, number: str, features: list[str]) -> dict[str, Any]:
    return {
        "vendor": vendor,
        "model": model,
        "family": family,
        "model_number": number,
        "stepping": "1",
        "cores": 2,
        "features": features,
    }


#: CI's two VM kinds and an Intel one, as their fingerprints name them.
ZEN3 = proc("AMD EPYC 7763 64-Core Processor", "AuthenticAMD", "25", "1", ["avx", "avx2", "fma", "f16c"])
ZEN4 = proc(
    "AMD EPYC 9V74 80-Core Processor",
    "AuthenticAMD",
    "25",
    "17",
    ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"],
)
XEON = proc(
    "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
    "GenuineIntel",
    "6",
    "143",
    ["avx", "avx2", "fma", "f16c", "avx512f", "amx_tile", "amx_bf16"],
)
FASTER = [t / 2 for t in STEADY]  # twice the throughput


def run_on(
    tmp_path: Path,
    processor: dict[str, Any],
    times: Sequence[float],
    peak: float = 100.0,
    profile: Any = CPU,
    **kw: Any,
) -> ScenarioResult:
    """One session on a machine whose fingerprint names ``processor``."""
    launcher = FakeLauncher([times] * 4, peaks=(peak, peak))
    settings = RunSettings(profile=profile, baselines_dir=tmp_path / "baselines", workdir=tmp_path, confirm=0, **kw)
    return PerfSession(settings, {**FINGERPRINT, "processor": processor}, launcher).run(SCENARIO)


def group_doc(tmp_path: Path, profile: str = "cpu") -> dict[str, Any]:
    return json.loads((tmp_path / "baselines" / profile / "g.json").read_text())


def samples(entry: dict[str, Any]) -> float:
    return float(entry["metrics"]["samples_per_s"]["mean"])


def test_each_processor_keeps_its_entry_when_another_records(tmp_path: Path) -> None:
    assert run_on(tmp_path, ZEN3, STEADY, update_baselines=True).verdict == "recorded"
    assert group_doc(tmp_path)["schema_version"] == 1  # one processor: the file as before
    assert run_on(tmp_path, ZEN4, FASTER, update_baselines=True).verdict == "recorded"
    doc = group_doc(tmp_path)
    first = doc["scenarios"][SCENARIO.id]
    assert doc["schema_version"] == 2  # an older perfsuite refuses it rather than recording over the first entry
    assert first["fingerprint"]["processor"] == ZEN3 and samples(first) == pytest.approx(40, rel=0.02)
    [zen4] = first[OTHER_PROCESSORS]
    assert zen4["fingerprint"]["processor"] == ZEN4 and samples(zen4) == pytest.approx(80, rel=0.02)

    # Each records again: only its own entry changes, the other's is written back byte for byte.
    run_on(tmp_path, ZEN3, SLOW, update_baselines=True)
    again = group_doc(tmp_path)["scenarios"][SCENARIO.id]
    assert samples(again) == pytest.approx(20, rel=0.02) and again[OTHER_PROCESSORS] == [zen4]
    run_on(tmp_path, ZEN4, STEADY, update_baselines=True)
    last = group_doc(tmp_path)["scenarios"][SCENARIO.id]
    assert {k: v for k, v in last.items() if k != OTHER_PROCESSORS} == {
        k: v for k, v in again.items() if k != OTHER_PROCESSORS
    }
    assert [samples(e) for e in last[OTHER_PROCESSORS]] == [pytest.approx(40, rel=0.02)]
    # A third processor adds its own entry after the others.
    run_on(tmp_path, XEON, STEADY, update_baselines=True)
    procs = [e["fingerprint"]["processor"] for e in group_doc(tmp_path)["scenarios"][SCENARIO.id][OTHER_PROCESSORS]]
    assert procs == [ZEN4, XEON]


def test_timing_is_judged_against_the_runs_own_processor(tmp_path: Path) -> None:
    run_on(tmp_path, ZEN3, STEADY, update_baselines=True)  # 40 samples/s
    run_on(tmp_path, ZEN4, FASTER, update_baselines=True)  # 80 samples/s
    # A planted 2x slowdown fails on the processor whose entry it is, against that entry.
    slower = run_on(tmp_path, ZEN3, SLOW)
    assert slower.verdict == "regression", slower.judgement.message
    assert slower.baseline is not None and slower.baseline.fingerprint["processor"] == ZEN3
    # Zen 4 at Zen 3's speed is half its own entry: a regression, although Zen 3's entry says 40.
    halved = run_on(tmp_path, ZEN4, STEADY)
    assert halved.verdict == "regression", halved.judgement.message
    assert halved.baseline is not None and halved.baseline.fingerprint["processor"] == ZEN4
    # Each at its own speed passes; neither is other_machine.
    assert run_on(tmp_path, ZEN3, STEADY).verdict == "pass"
    assert run_on(tmp_path, ZEN4, FASTER).verdict == "pass"
    # A third processor has no entry: timing not judged, memory judged against the first entry.
    xeon = run_on(tmp_path, XEON, SLOW)
    assert xeon.verdict == "other_machine", xeon.judgement.message
    assert "peak_mem_mib" in xeon.judgement.message and processors.describe(ZEN3) in xeon.judgement.message
    assert {c.metric for c in xeon.judgement.checks} >= {"peak_mem_mib"}


def test_memory_is_judged_across_processors_against_the_first_entry_where_there_is_no_own(tmp_path: Path) -> None:
    run_on(tmp_path, ZEN3, STEADY, peak=100.0, update_baselines=True)
    run_on(tmp_path, ZEN4, STEADY, peak=200.0, update_baselines=True)
    grown = run_on(tmp_path, XEON, STEADY, peak=200.0)  # against Zen 3's 100 MiB: memory grew
    assert grown.verdict == "regression", grown.judgement.message
    assert "timing not judged" in grown.judgement.message or "not judged" in grown.judgement.message
    assert run_on(tmp_path, XEON, STEADY, peak=100.0).verdict == "other_machine"
    # Zen 4's own entry holds 200 MiB: its memory is judged against that, not Zen 3's.
    assert run_on(tmp_path, ZEN4, STEADY, peak=200.0).verdict == "pass"
    assert run_on(tmp_path, ZEN4, STEADY, peak=400.0).verdict == "regression"


def test_a_gpu_like_profile_keeps_one_entry_per_scenario(tmp_path: Path) -> None:
    """A profile that judges timing across processors replaces the scenario's one entry, whatever
    host processor recorded it, and judges another's timing (the card is what it times)."""
    gpu_like = dataclasses.replace(CPU, timed_on_other_processor=True)
    run_on(tmp_path, ZEN3, STEADY, profile=gpu_like, update_baselines=True)
    run_on(tmp_path, ZEN4, FASTER, profile=gpu_like, update_baselines=True)
    doc = group_doc(tmp_path)
    entry = doc["scenarios"][SCENARIO.id]
    assert doc["schema_version"] == 1 and OTHER_PROCESSORS not in entry
    assert entry["fingerprint"]["processor"] == ZEN4 and samples(entry) == pytest.approx(80, rel=0.02)
    assert run_on(tmp_path, XEON, SLOW, profile=gpu_like).verdict == "regression"


def test_the_committed_files_load_and_an_old_single_entry_file_keeps_its_entry(tmp_path: Path) -> None:
    committed = sorted(p for p in (REPO / "baselines" / "cpu").glob("*.json") if "scenarios" in p.read_text())
    assert committed
    for path in committed:  # every scenario has the two AMD kinds CI ran on: Zen 3 (model 1), then Zen 4 (17)
        for key, entries in load_group(path).items():
            kinds = [e.fingerprint["processor"]["model_number"] for e in entries]
            assert kinds == ["1", "17"], f"{path}: {key}: {kinds}"
    # Recording on another processor beside an old (version 1) file's entry keeps that entry as it was.
    source = committed[0]
    (tmp_path / "cpu").mkdir()
    old = tmp_path / "cpu" / source.name
    single = json.loads(source.read_text())
    single["schema_version"] = 1
    for entry in single["scenarios"].values():
        entry.pop(OTHER_PROCESSORS, None)
    old.write_text(json.dumps(single, indent=1))
    before = json.loads(old.read_text())
    key, entry = next(iter(before["scenarios"].items()))
    store = BaselineStore(tmp_path, "cpu", XEON)
    assert store.get(source.stem, key) is not None and store.own(source.stem, key) is None
    recorded = store.record(source.stem, key, "ok", {"peak_mem_mib": 1.0}, {"processor": XEON})
    after = json.loads(old.read_text())
    kept = after["scenarios"][key]
    assert {k: v for k, v in kept.items() if k != OTHER_PROCESSORS} == entry
    assert kept[OTHER_PROCESSORS] == [recorded.to_json()]
    assert {k: v for k, v in after["scenarios"].items() if k != key} == {
        k: v for k, v in before["scenarios"].items() if k != key
    }
    # A reader that names no processor (simulate, selftest) sees the first entry.
    assert BaselineStore(tmp_path, "cpu").get(source.stem, key) == load_group(old)[key][0]
    assert BaselineStore(tmp_path, "cpu", XEON).get(source.stem, key) == recorded


def bad_file(tmp_path: Path, others: Any, version: int = 2) -> Path:
    path = tmp_path / "cpu" / "g.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    first = {"expected": "ok", "metrics": {"peak_mem_mib": 1.0}, "fingerprint": {"processor": ZEN3}}
    doc = {"schema_version": version, "scenarios": {"g.s": {**first, OTHER_PROCESSORS: others}}}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("others", "version", "says"),
    [
        ({"processor": "zen4"}, 2, r"other_processors must be a list"),
        ([{"expected": "ok", "metrics": {}}], 2, r"other_processors\[0\] must be one processor's entry"),
        (
            [{"metrics": {}, "fingerprint": {"processor": ZEN3}}],
            2,
            r"other_processors\[0\] was recorded on a processor",
        ),
        (
            [{"metrics": {"peak_mem_mib": "big"}, "fingerprint": {"processor": ZEN4}}],
            2,
            r"\[0\]\.metrics\.peak_mem_mib",
        ),
        ([], 3, r"schema_version must be one of \(1, 2\)"),
    ],
)
def test_a_corrupt_entry_names_the_file_and_is_never_rewritten(
    tmp_path: Path, others: Any, version: int, says: str
) -> None:
    path = bad_file(tmp_path, others, version)
    text = path.read_text()
    with pytest.raises(BaselineError, match=rf"baseline file {path}: .*{says}"):
        BaselineStore(tmp_path, "cpu", ZEN4).get("g", "g.s")
    with pytest.raises(BaselineError, match=says):
        BaselineStore(tmp_path, "cpu", ZEN4).record("g", "g.s", "ok", {}, {"processor": ZEN4})
    assert path.read_text() == text


def test_bootstrap_counts_only_this_processors_entry_as_done(tmp_path: Path) -> None:
    from perfsuite.commands.bootstrap.plan import Target
    from perfsuite.commands.bootstrap.run import Stores, usable
    from perfsuite.commands.bootstrap.state import done_in

    run_on(tmp_path, ZEN3, STEADY, update_baselines=True)
    run_on(tmp_path, ZEN4, STEADY, update_baselines=True)
    targets = [Target(SCENARIO.id, "g", "nodeid", "train", 2, "shape")]
    for processor, done in ((ZEN3, {SCENARIO.id}), (ZEN4, {SCENARIO.id}), (XEON, set())):
        here = {**FINGERPRINT, "processor": processor}
        store = Stores(tmp_path / "baselines", "cpu", CPU.entry_processor(here))()
        assert done_in(store, targets, 1, usable(here, CPU)).baselines == done, processor["model"]


# -- op profiles follow their baselines: one per processor on cpu --------------------------------------


def op_profile(addmm_ms: float) -> OpProfile:
    return OpProfile(
        "cpu", 5, 0.011, 0.010, (OpStat("aten::addmm", 1.0, addmm_ms * 1000), OpStat("aten::add_", 1.0, 1e3))
    )


def test_each_processor_keeps_its_op_profile_and_reads_only_its_own(tmp_path: Path) -> None:
    ProfileStore(tmp_path, "cpu", ZEN3).record("g", "g.s", op_profile(5.0))
    ProfileStore(tmp_path, "cpu", ZEN4).record("g", "g.s", op_profile(2.0))
    ProfileStore(tmp_path, "cpu", ZEN3).record("g", "g.s", op_profile(6.0))  # replaces Zen 3's only
    path = ProfileStore(tmp_path, "cpu").path("g")
    first = json.loads(path.read_text())["scenarios"]["g.s"]
    assert first["processor"] == ZEN3 and [o["processor"] for o in first[OTHER_PROCESSORS]] == [ZEN4]
    for processor, addmm_us in ((ZEN3, 6000.0), (ZEN4, 2000.0)):
        found = ProfileStore(tmp_path, "cpu", processor).lookup("g", "g.s")
        assert found.profile is not None and found.profile.ops[0].cpu_us == addmm_us and found.elsewhere == 1
    # A third processor compares with none: another processor's ops would explain the processor.
    assert ProfileStore(tmp_path, "cpu", XEON).lookup("g", "g.s") == Lookup(None, 2)
    lead = Explanation(op_profile(9.0), None, str(path), elsewhere=2).lead()
    assert lead.startswith(f"op profile: none stored for this processor in {path} (2 other processor(s)")
    assert (
        "--perf-update-baselines" in lead
        and Explanation.from_json(
            json.loads(json.dumps(Explanation(op_profile(9.0), None, "p", elsewhere=2).to_json()))
        ).elsewhere
        == 2
    )
    # A profile that keeps one profile per scenario (GPUs: processor None) reads and replaces the first.
    ProfileStore(tmp_path, "cpu").record("g", "g.s", op_profile(1.0))
    again = json.loads(path.read_text())["scenarios"]["g.s"]
    assert "processor" not in again and again[OTHER_PROCESSORS] == first[OTHER_PROCESSORS]


def test_op_profile_files_name_their_version_and_an_unnamed_profile_is_taken_as_this_processors(
    tmp_path: Path,
) -> None:
    path = ProfileStore(tmp_path, "cpu").path("g")
    ProfileStore(tmp_path, "cpu").record("g", "g.s", op_profile(5.0))  # a GPU-like store: names none
    assert json.loads(path.read_text())["version"] == 1  # as every perfsuite wrote and reads it
    # An unnamed profile (recorded before perfsuite kept the processor) may be this processor's:
    # read as such, as an unnamed baseline entry is, and replaced by its recording.
    assert ProfileStore(tmp_path, "cpu", ZEN4).lookup("g", "g.s") == Lookup(op_profile(5.0), 0)
    ProfileStore(tmp_path, "cpu", ZEN4).record("g", "g.s", op_profile(2.0))
    doc = json.loads(path.read_text())
    assert doc["version"] == 2  # names a processor: an older perfsuite refuses it, never records over it
    assert doc["scenarios"]["g.s"]["processor"] == ZEN4 and OTHER_PROCESSORS not in doc["scenarios"]["g.s"]
    assert ProfileStore(tmp_path, "cpu", ZEN3).lookup("g", "g.s") == Lookup(None, 1)
    doc["version"] = 3
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"op_profiles/g\.json: not an op profile file of version \(1, 2\)"):
        ProfileStore(tmp_path, "cpu", ZEN4).lookup("g", "g.s")


def test_a_session_reads_and_records_op_profiles_as_its_processor(tmp_path: Path) -> None:
    def store_of(profile: Any, processor: dict[str, Any]) -> ProfileStore:
        settings = RunSettings(profile=profile, baselines_dir=tmp_path, workdir=tmp_path)
        return PerfSession(settings, {**FINGERPRINT, "processor": processor}, FakeLauncher([])).op_profiles.store_for(
            "cpu"
        )

    assert store_of(CPU, ZEN4).processor == ZEN4 and store_of(CPU, XEON).processor == XEON
    assert store_of(dataclasses.replace(CPU, timed_on_other_processor=True), ZEN4).processor is None


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        ({OTHER_PROCESSORS: {}}, "must be a list"),
        ({OTHER_PROCESSORS: [{}]}, "missing field"),
        ({"processor": ZEN3, OTHER_PROCESSORS: ["x"]}, r"other_processors\[0\]: expected an object"),
        ("processor", "expected an object"),
    ],
)
def test_a_bad_op_profile_entry_names_the_file_and_is_never_rewritten(tmp_path: Path, scenario: Any, says: str) -> None:
    store = ProfileStore(tmp_path, "cpu", ZEN4)
    fields = op_profile(5.0).to_json()
    doc = {
        "version": 1,
        "group": "g",
        "scenarios": {"g.s": {**fields, **scenario} if isinstance(scenario, dict) else scenario},
    }
    store.path("g").parent.mkdir(parents=True)
    store.path("g").write_text(json.dumps(doc))
    text = store.path("g").read_text()
    with pytest.raises(BaselineError, match=rf"op_profiles/g\.json.*{says}"):
        store.record("g", "g.s", op_profile(1.0))
    assert store.path("g").read_text() == text


def test_a_second_op_profile_of_one_processor_is_refused(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path, "cpu", ZEN4)
    fields = op_profile(5.0).to_json()
    doc = {
        "version": 1,
        "group": "g",
        "scenarios": {"g.s": {**fields, "processor": ZEN3, OTHER_PROCESSORS: [{**fields, "processor": ZEN3}]}},
    }
    store.path("g").parent.mkdir(parents=True)
    store.path("g").write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match="must name a processor no other profile of the scenario has"):
        store.lookup("g", "g.s")


def test_the_committed_op_profiles_are_each_processors_own() -> None:
    # Each AMD kind CI runs on reads its own profiles: Zen 3's from its recording with the baselines,
    # Zen 4's from a later one. One scenario has only Zen 4's: its older profile, from a VM whose
    # processor was never recorded, was the one the Zen 4 recording replaced.
    kinds: dict[str, list[str]] = {}
    for path in sorted((REPO / "baselines" / "cpu" / "op_profiles").glob("*.json")):
        entries = load_group(REPO / "baselines" / "cpu" / path.name)
        for key in json.loads(path.read_text())["scenarios"]:
            procs = {e.fingerprint["processor"]["model_number"]: e.fingerprint["processor"] for e in entries[key]}
            own = [
                n
                for n, proc in procs.items()
                if ProfileStore(REPO / "baselines", "cpu", proc).lookup(path.stem, key).profile
            ]
            kinds[key] = own
            assert ProfileStore(REPO / "baselines", "cpu", XEON).lookup(path.stem, key).profile is None, key
    assert {key: own for key, own in kinds.items() if own != ["1", "17"]} == {
        "parallel_3d.tp1_pp2_interleaved_1f1b": ["17"]
    }
