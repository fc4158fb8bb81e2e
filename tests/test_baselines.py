from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsuite.baselines import BaselineError, BaselineStore, load_group_file

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
    assert sorted(p.name for p in (tmp_path / "cpu").iterdir()) == ["g.json"]
    assert list(json.loads((tmp_path / "cpu" / "g.json").read_text())["scenarios"]) == ["g.s0", "g.s1", "g.s2"]
