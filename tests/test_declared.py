"""A row run as its profile's variant says what it declares: an fp16 row that
runs bf16 on cpu says so in its results config and in the summaries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from perfsuite import ModelSpec, Scenario, ScenarioError
from perfsuite.core.workloads.base import ran_otherwise
from perfsuite.gate.session import ScenarioResult
from perfsuite.judge.compare import Judgement
from perfsuite.reports.html import summary
from perfsuite.reports.summary import summary_lines

SEED = ModelSpec("bert_pretraining", layers=12, hidden=768, heads=12, vocab=30522, max_positions=512)
TINY = ModelSpec("bert_pretraining", layers=2, hidden=128, heads=2, vocab=8192, max_positions=128)
CPU = dict(model=TINY, world_size=2, micro_batch=4, global_batch=8, seq_len=128, precision="bf16")
AMP = Scenario(
    "mp",
    "amp",
    SEED,
    precision="fp16",
    world_size=4,
    micro_batch=16,
    global_batch=64,
    seq_len=512,
    variants={"cpu": CPU},
)


def test_the_resolved_row_keeps_the_declared_values_its_variant_changed() -> None:
    cpu = AMP.resolve(("cpu",))
    assert isinstance(cpu, Scenario) and cpu.precision == "bf16"
    assert cpu.declared["precision"] == "fp16" and cpu.declared["model"] == SEED
    config = json.loads(json.dumps(cpu.to_config(), allow_nan=False))  # the results file's config
    assert (config["precision"], config["declared"]["precision"]) == ("bf16", "fp16")
    assert config["declared"]["model"]["layers"] == 12 and config["declared"]["seq_len"] == 512
    assert ran_otherwise(config) == "fp16 row ran bf16 on this profile"
    # Fitting to the hardware keeps the record; a field the variant sets to its own value is not one.
    assert cpu.at_world_size(1).declared == cpu.declared
    same = Scenario(
        "mp",
        "fp32",
        SEED,
        world_size=4,
        micro_batch=16,
        global_batch=64,
        seq_len=512,
        variants={"cpu": {**CPU, "precision": "fp32"}},
    )
    fp32 = same.resolve(("cpu",))
    assert "precision" not in fp32.declared and ran_otherwise(fp32.to_config()) is None


def test_a_profile_without_a_variant_runs_the_row_as_declared() -> None:
    gpu = AMP.resolve(("cuda-80gb", "cuda"))
    assert gpu.declared == {} and "declared" not in gpu.to_config() and ran_otherwise(gpu.to_config()) is None


def test_declared_is_no_field_for_a_variant_and_names_only_fields() -> None:
    with pytest.raises(ScenarioError, match=r"variants\['cpu'\]"):
        Scenario("mp", "x", TINY, variants={"cpu": {"declared": {"precision": "fp16"}}})
    with pytest.raises(ScenarioError, match="field 'declared' names no field a variant can change: 'colour'"):
        Scenario("mp", "x", TINY, declared={"colour": "red"})


def test_the_trainer_sweeps_fp16_rows_say_they_ran_bf16_on_cpu() -> None:
    from bench_tests.test_trainer_sweep import SCENARIOS

    fp16 = [s for s in SCENARIOS if s.name.endswith("_fp16")]
    assert fp16 and all(
        ran_otherwise(s.resolve(("cpu",)).to_config()) == "fp16 row ran bf16 on this profile" for s in fp16
    )


def test_the_terminal_summary_notes_the_row() -> None:
    results = [
        ScenarioResult(AMP.resolve(("cpu",)), "ok", Judgement("pass", "")),
        ScenarioResult(AMP.resolve(("cuda",)), "ok", Judgement("pass", "")),
    ]
    lines = summary_lines(results)
    assert lines[-1] == "note: mp.amp: fp16 row ran bf16 on this profile"
    assert sum(line.startswith("note:") for line in lines) == 1


def _result(verdict: str, message: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"id": "mp.amp", "status": "ok", "verdict": verdict, "message": message, "config": config, "metrics": {}}


def test_the_markdown_summary_and_the_report_say_so_in_the_detail() -> None:
    config = AMP.resolve(("cpu",)).to_config()
    document = {"profile": "cpu", "machine": {}, "results": [_result("pass", "", config)]}
    assert "| `mp.amp` | ✅ pass | - | - | - | fp16 row ran bf16 on this profile |" in summary.markdown(document)
    regressed = summary.row(
        _result("regression", "samples_per_s 50 vs baseline 100", config), []
    )  # the page's rows too
    assert regressed[-1] == "samples_per_s 50 vs baseline 100 (fp16 row ran bf16 on this profile)"
    assert summary.row(_result("pass", "", AMP.resolve(("cuda",)).to_config()), [])[-1] == ""
