"""Notes on a verdict (perfsuite.judge.compare.Note) and the calibration record a baseline entry keeps
(perfsuite.judge.calibration.Calibration): the message and the stored JSON are what they were when both
were built by concatenation and f-string keys."""

from __future__ import annotations

from typing import Any

import pytest

from perfsuite.judge import judging
from perfsuite.judge.calibration import Calibration, Facts, describe, machine_spread, pooled, spread_of
from perfsuite.judge.compare import Judgement, MetricCheck, Note


def test_a_judgement_without_notes_says_its_own_message() -> None:
    assert Judgement("pass", "within tolerance of baseline").message == "within tolerance of baseline"


@pytest.mark.parametrize(
    ("placement", "shown"),
    [
        ("bracketed", "base [note]"),
        ("before", "note base"),
        ("clause", "base; note"),
        ("line_after", "base\nnote"),
        ("line_before", "note\nbase"),
    ],
)
def test_each_placement_puts_the_note_where_the_message_always_had_it(placement: Any, shown: str) -> None:
    assert Judgement("pass", "base").noted(Note("machine", "note", placement)).message == shown


def test_noting_keeps_the_judgement_and_wraps_notes_in_order() -> None:
    check = MetricCheck("samples_per_s", 1.0, 2.0, 0.1, "higher", "regression")
    first = Judgement("regression", "slower", (check,), ("torch 2.12 -> 2.13",))
    noted = first.noted(Note("unjudged", "a")).noted(Note("op_profile", "ops", "line_before"))
    assert first.notes == () and first.message == "slower"
    assert (noted.verdict, noted.checks, noted.stack_changes) == (first.verdict, first.checks, first.stack_changes)
    assert [n.kind for n in noted.notes] == ["unjudged", "op_profile"]
    assert noted.message == "ops\nslower [a]"
    assert noted.notes_of("op_profile") == (Note("op_profile", "ops", "line_before"),)


def test_the_retry_helpers_add_contention_and_confirmation_notes() -> None:
    attempts = [
        {"verdict": "regression", "message": "slower", "samples_per_s": 10.0},
        {"verdict": "pass", "message": "fine", "samples_per_s": {"mean": 20.0}},
    ]
    judged = Judgement("pass", "within tolerance of baseline")
    assert [n.kind for n in judging.remeasured(judged, ["busy"]).notes] == ["contention"]
    assert [n.kind for n in judging.still_contended(judged, ["busy"], None, 0).notes] == ["contention"]
    unconfirmed = judging.unconfirmed(judged, attempts)
    assert [(n.kind, n.placement) for n in unconfirmed.notes] == [("confirmation", "before")]
    assert unconfirmed.message.endswith(" within tolerance of baseline")
    confirmed = judging.confirmed(Judgement("regression", "slower"), attempts, "samples_per_s")
    assert [(n.kind, n.placement) for n in confirmed.notes] == [("confirmation", "bracketed")]
    assert confirmed.message.startswith("slower [") and confirmed.base_message == "slower"


SOURCES = [
    {
        "machine": f"m{i}",
        "label": f"machine {i}",
        "processor": "cpu",
        "recorded_at": f"2026-11-2{i}",
        "commit": None,
        "launches": {"samples_per_s": [100.0 + i, 101.0 + i, 99.0 + i]},
        "steps": {},
    }
    for i in range(2)
]
FACTS = Facts({"samples_per_s": 0.05}, 0.02, True, "samples_per_s")


def stored_by_flat_keys(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """The calibration JSON as it was written key by key, for a pool of ``sources``."""
    spread = spread_of([s["launches"]["samples_per_s"] for s in sources])
    sigma, basis = machine_spread(spread.machine, spread.machines, 0.02)
    return {
        "floor_samples_per_s": 0.05,
        "profile_machine_spread": 0.02,
        "across_processors": True,
        "primary": "samples_per_s",
        "machines": 2,
        "sources": sources,
        "repeats": 6,
        "cv_samples_per_s": spread.cv_launch,
        "machine_spread_samples_per_s": sigma,
        "machine_spread_basis_samples_per_s": basis,
        "machine_spread_measured_samples_per_s": spread.machine,
    }


def test_the_calibration_record_stores_the_same_json_and_reads_it_back() -> None:
    expected = stored_by_flat_keys(SOURCES)
    record = pooled(SOURCES, FACTS).calibration
    assert record.to_json() == expected
    assert Calibration.from_json(expected) == record
    assert Calibration.from_json(expected).to_json() == expected
    ended = {**{k: v for k, v in expected.items() if k != "sources"}, "pool_ended": "then", "not_pooled": ["x"]}
    assert Calibration.from_json(ended).to_json() == ended


def test_an_entry_calibrated_before_machines_were_pooled_is_still_described() -> None:
    old = {"cv_samples_per_s": 0.01, "floor_samples_per_s": 0.05, "repeats": 5}
    record = Calibration.from_json(old)
    assert record.sources is None and record.metrics["samples_per_s"].basis is None
    assert describe(old, "samples_per_s", 0.05) == record.describe("samples_per_s", 0.05)
    assert describe(old, "peak_mem_mib", None) == ""
