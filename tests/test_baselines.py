from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfsuite.reports.summary import ResultsWriteError, write_results
from perfsuite.store.baselines import BaselineError, BaselineStore, load_group_file

METRICS = {"samples_per_s": {"mean": 10.0, "std": 0.5, "n": 5}, "peak_mem_mib": 100.0}


def test_record_then_read_back(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "cpu")
    store.record("g", "g.a", "ok", METRICS, {"host": "x"})
    entries = load_group_file(tmp_path / "cpu" / "g.json")
    assert entries["g.a"].value("samples_per_s") == 10.0
    assert entries["g.a"].value("peak_mem_mib") == 100.0


def test_update_keeps_hand_set_fields_and_other_scenarios(tmp_path: Path) -> None:
    path = tmp_path / "cpu" / "g.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "scenarios": {
                    "g.a": {
                        "expected": "ok",
                        "metrics": {"peak_mem_mib": 1.0},
                        "tolerances": {"samples_per_s": 0.2},
                        "note": "tuned by hand",
                        "owner": "infra-team",
                    },
                    "g.b": {"expected": "oom", "metrics": {}},
                },
            }
        )
    )
    BaselineStore(tmp_path, "cpu").record("g", "g.a", "ok", METRICS, {})
    doc = json.loads(path.read_text())
    a = doc["scenarios"]["g.a"]
    assert a["tolerances"] == {"samples_per_s": 0.2} and a["note"] == "tuned by hand"
    assert a["owner"] == "infra-team" and a["metrics"]["peak_mem_mib"] == 100.0
    assert doc["scenarios"]["g.b"] == {"expected": "oom", "metrics": {}, "tolerances": {}, "fingerprint": {}}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('{"schema_version": 99, "scenarios": {}}', "schema_version"),
        ('{"schema_version": 1, "scenarios": []}', "scenarios"),
        ('{"schema_version": 1, "scenarios": {"g.a": {"expected": "sometimes"}}}', "expected"),
        ('{"schema_version": 1, "scenarios": {"g.a": {"metrics": {"peak_mem_mib": "big"}}}}', "peak_mem_mib"),
        ('{"schema_version": 1, "scenarios": {"g.a": {"tolerances": {"samples_per_s": 2}}}}', "tolerances"),
        (
            '{"schema_version": 1, "scenarios": {"g.a": {"metrics": {"tflops": {"mean": 1.0, "std": "fast", "n": 8}}}}}',
            r"metrics\.tflops\.std must be a finite number",
        ),
        (
            '{"schema_version": 1, "scenarios": {"g.a": {"metrics": {"tflops": {"mean": 1.0, "std": 0.1, "n": null}}}}}',
            r"metrics\.tflops\.n must be a whole number",
        ),
    ],
)
def test_invalid_file_is_named_and_never_overwritten(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "cpu" / "g.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    store = BaselineStore(tmp_path, "cpu")
    with pytest.raises(BaselineError, match=problem) as info:
        store.get("g", "g.a")
    assert str(path) in str(info.value)
    with pytest.raises(BaselineError):
        store.record("g", "g.a", "ok", METRICS, {})
    assert path.read_text() == content


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "cpu")
    for i in range(3):
        store.record("g", f"g.s{i}", "ok", METRICS, {})
    # The lock file stays (removing it races a waiting writer); git ignores it.
    assert sorted(p.name for p in (tmp_path / "cpu").iterdir()) == ["g.json", "g.json.lock"]
    assert list(json.loads((tmp_path / "cpu" / "g.json").read_text())["scenarios"]) == ["g.s0", "g.s1", "g.s2"]


def test_a_written_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path: Path) -> None:
    """The temp file behind an atomic write is 0600; a baseline others read must not become so."""
    store, path = BaselineStore(tmp_path, "cpu"), tmp_path / "cpu" / "g.json"
    old = os.umask(0o027)
    try:
        store.record("g", "g.a", "ok", METRICS, {})
        assert path.stat().st_mode & 0o777 == 0o640
        path.chmod(0o664)
        store.record("g", "g.b", "ok", METRICS, {})
        assert path.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


def _record_many(root: str, prefix: str, count: int, start: Any) -> None:
    store = BaselineStore(Path(root), "cpu")
    store.group("g")  # read (and cache) the group before the other run writes to it
    start.wait(30)  # both runs record at once
    for i in range(count):
        store.record("g", f"g.{prefix}{i}", "ok", METRICS, {})


def test_concurrent_updates_of_one_group_keep_every_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    runs = [ctx.Process(target=_record_many, args=(str(tmp_path), prefix, 25, start)) for prefix in ("a", "b")]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
        assert run.exitcode == 0
    stored = json.loads((tmp_path / "cpu" / "g.json").read_text())["scenarios"]
    assert sorted(stored) == sorted(f"g.{p}{i}" for p in "ab" for i in range(25))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs: writes past it fail with ENOSPC as on a full disk."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> None:
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # ENOSPC: the disk is full
    finally:
        os.close(fd)


def test_a_full_disk_leaves_the_old_baseline_file_intact(tiny_disk: Path) -> None:
    store = BaselineStore(tiny_disk, "cpu")
    store.record("g", "g.s0", "ok", METRICS, {})
    before = (tiny_disk / "cpu" / "g.json").read_bytes()
    fill(tiny_disk)
    with pytest.raises(BaselineError, match=r"g\.json: cannot write it .*unchanged"):
        store.record("g", "g.s1", "ok", {"samples_per_s": 1.0} | METRICS, {"host": "x" * 20000})
    assert (tiny_disk / "cpu" / "g.json").read_bytes() == before
    assert sorted(p.name for p in (tiny_disk / "cpu").iterdir()) == ["g.json", "g.json.lock"]


def test_a_full_disk_leaves_the_old_results_file_intact(tiny_disk: Path) -> None:
    path = tiny_disk / "results.json"
    write_results(path, {"results": []})
    fill(tiny_disk)
    with pytest.raises(ResultsWriteError, match=r"cannot write the results file .*results\.json .*unchanged"):
        write_results(path, {"results": [{"id": "x" * 100_000}]})
    assert json.loads(path.read_text()) == {"results": []}


def test_every_committed_baseline_and_estimates_file_loads() -> None:
    """What sessions committed (cpu, GPU profiles, named environments) is valid,
    so no scenario of a profile fails on a broken group file."""
    from perfsuite.commands.bootstrap.costs import Costs
    from perfsuite.store.baselines import COSTS_FILENAME

    root = Path(__file__).parents[1] / "baselines"
    groups = [p for p in root.glob("*/*.json") if p.name != COSTS_FILENAME]
    assert {p.parent.name for p in groups} >= {"cpu", "nvidia-h200-x1"}
    for path in groups:
        assert load_group_file(path), f"{path} holds no scenario"
    for path in root.glob(f"*/{COSTS_FILENAME}"):
        assert Costs.load(path, "cuda" if path.parent.name.startswith("nvidia-") else "cpu").launch_s
